"""Data the dashboard shows but other parts of fleet produce: live GPU telemetry and its
history (from agents), job logs and what-if estimates (API endpoints), and the scheduler's
settings and cycle records.

Each function returns None when that part has not landed or has no data yet, so a page
says so plainly ("no telemetry yet") and never shows a made-up value.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.urls import NoReverseMatch, reverse

from fleet.models import Node


def _module(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def api_url(name: str, **kwargs: Any) -> str | None:
    """The URL of an API endpoint, or None while that endpoint does not exist yet."""
    try:
        return reverse(name, kwargs=kwargs or None)
    except NoReverseMatch:
        return None


def latest_samples(nodes: Iterable[Node]) -> dict[tuple[int, int], dict[str, Any]] | None:
    """The newest reading of each GPU of these nodes, keyed by (node id, GPU index).
    None: no telemetry store exists yet."""
    telemetry = _module("fleet.selectors.telemetry")
    fetch = getattr(telemetry, "gpu_latest", None)
    if fetch is None:
        return None
    nodes = list(nodes)
    by_name = {n.name: n.pk for n in nodes}
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for (node_name, index), sample in fetch(node_names=list(by_name)).items():
        if node_name in by_name and sample:
            out[(by_name[node_name], int(index))] = sample
    return out


def telemetry_history(
    *, node: Node, since: datetime, until: datetime, gpu_indices: list[int] | None = None
) -> list[dict[str, Any]] | None:
    """GPU readings of one node over [since, until], oldest first, each a dict with `at`,
    `index` and the sample fields. None: no telemetry history exists yet."""
    telemetry = _module("fleet.selectors.telemetry")
    fetch = getattr(telemetry, "gpu_history", None)
    if fetch is None:
        return None
    rows = fetch(node=node, since=since, until=until)
    if gpu_indices is not None:
        wanted = set(gpu_indices)
        rows = [r for r in rows if r.get("index") in wanted]
    return list(rows)


def scheduler_state() -> dict[str, Any] | None:
    """Active policy, weights, tick interval and recent cycles. None: not available yet."""
    selectors = _module("scheduler.selectors")
    fetch = getattr(selectors, "scheduler_settings_get", None)
    if fetch is None:
        return None
    return fetch()


def active_policy_name() -> str | None:
    state = scheduler_state()
    if not state:
        return None
    return state.get("policy")
