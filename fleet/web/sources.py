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
    """The newest cached reading of each GPU of these nodes (GPUs must be prefetched),
    keyed by (node id, GPU index). None: no telemetry store exists yet. One cache
    round trip, no database query."""
    telemetry = _module("fleet.selectors.telemetry")
    fetch = getattr(telemetry, "gpu_latest_samples", None)
    if fetch is None:
        return None
    gpus = [g for n in nodes for g in n.gpus.all()]
    found = fetch(gpus)
    where = {g.uuid: (g.node_id, g.index) for g in gpus}
    return {where[uuid]: sample for uuid, sample in found.items() if uuid in where}


def telemetry_history(
    *, node: Node, since: datetime, until: datetime, gpu_indices: list[int] | None = None
) -> list[dict[str, Any]] | None:
    """GPU readings of one node over [since, until], oldest first, each a dict with `at`,
    `index` and the sample fields. None: no telemetry history exists yet."""
    telemetry = _module("fleet.selectors.telemetry")
    fetch = getattr(telemetry, "telemetry_history", None)
    if fetch is None:
        return None
    history = fetch(node=node, since=since, until=until, now=until)
    if not any(g.get("points") for g in history.get("gpus", [])):
        # Long ranges read the minute rollups, which lag the raw samples; a young fleet
        # has only raw ones. Show those rather than nothing.
        retention = getattr(_module("fleet.services.telemetry"), "raw_retention", None)
        if retention is not None and since < until - retention():
            history = fetch(node=node, since=until - retention(), until=until, now=until)
    wanted = None if gpu_indices is None else set(gpu_indices)
    rows = []
    for gpu in history.get("gpus", []):
        if wanted is not None and gpu["index"] not in wanted:
            continue
        for point in gpu.get("points", []):
            rows.append({**point, "at": point.get("t"), "index": gpu["index"]})
    return rows


def scheduler_settings() -> Any | None:
    """The scheduler's settings row (created with defaults when missing), or None while
    the scheduler app does not exist."""
    config = _module("scheduler.cycle.config")
    if config is None:
        return None
    return config.settings_get()


def recent_cycles(limit: int = 60) -> list[Any] | None:
    models = _module("scheduler.models")
    record = getattr(models, "CycleRecord", None)
    if record is None:
        return None
    return list(record.objects.order_by("-id")[:limit])[::-1]


def active_policy_name() -> str | None:
    """Read-only: the name of the policy the next cycle uses, None if unknown."""
    models = _module("scheduler.models")
    row_type = getattr(models, "SchedulerSettings", None)
    if row_type is None:
        return None
    policy = row_type.objects.values_list("policy", flat=True).first()
    return policy or getattr(models, "DEFAULT_POLICY", None)
