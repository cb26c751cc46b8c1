"""The fleet page: every node with its GPUs as tiles, and the fleet's GPU totals."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from django.core.paginator import Paginator
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.dateparse import parse_datetime
from django.utils.safestring import SafeString

from fleet.models import Gpu, Job, Node, NodeState
from fleet.models.jobs import ACTIVE_STATES
from fleet.selectors.nodes import node_list
from fleet.web import live, sources
from fleet.web.access import member_required
from fleet.web.tiles import tiles_html

PER_PAGE = 100
MAX_PER_PAGE = 1000
# A reading older than this is shown as stale rather than as the GPU's present state.
STALE_SECONDS = 60


@dataclass
class Tile:
    index: int
    model: str
    memory_mb: int
    jobs: list[Job]
    util: int | None = None
    util_class: str = "util-none"
    mem_used_mb: int | None = None
    mem_percent: int | None = None
    temperature: int | None = None
    power: int | None = None
    stale: bool = False


@dataclass
class NodeRow:
    node: Node
    tiles: list[Tile] = field(default_factory=list)
    simulated: bool = False
    busy: int = 0

    @property
    def tiles_html(self) -> SafeString:
        return tiles_html(self.tiles)


def util_class(util: float | None) -> str:
    if util is None:
        return "util-none"
    return f"util-{min(4, int(util // 20))}"


def fleet_totals() -> dict[str, int]:
    """Free, busy, down and draining GPUs over the whole fleet: two grouped queries."""
    per_state = dict(
        Gpu.objects.values_list("node__state")
        .annotate(n=Count("id"))
        .values_list("node__state", "n")
    )
    held: set[tuple[int, int]] = set()
    rows = Job.objects.filter(state__in=ACTIVE_STATES).exclude(node__state=NodeState.DOWN)
    draining_busy = 0
    for node_id, indices, node_state in rows.values_list("node_id", "gpu_indices", "node__state"):
        for index in indices or []:
            if (node_id, index) not in held:
                held.add((node_id, index))
                draining_busy += node_state == NodeState.DRAINING
    busy = len(held)
    up = per_state.get(NodeState.UP, 0)
    draining = per_state.get(NodeState.DRAINING, 0)
    return {
        "total": up + draining + per_state.get(NodeState.DOWN, 0),
        "busy": busy,
        "free": up - (busy - draining_busy),
        "draining_idle": draining - draining_busy,
        "down": per_state.get(NodeState.DOWN, 0),
    }


def gpu_holders(nodes: list[Node]) -> dict[tuple[int, int], list[Job]]:
    """Which assigned or running job holds which GPU; loads only what a tile shows."""
    holders: dict[tuple[int, int], list[Job]] = {}
    jobs = (
        Job.objects.filter(node__in=nodes, state__in=ACTIVE_STATES)
        .select_related("owner")
        .only("id", "name", "node_id", "gpu_indices", "owner__username")
    )
    for job in jobs:
        for index in job.gpu_indices or []:
            holders.setdefault((job.node_id or 0, index), []).append(job)
    return holders


def build_rows(nodes: list[Node], now: float) -> tuple[list[NodeRow], bool]:
    holders = gpu_holders(nodes)
    samples = sources.latest_samples(nodes)
    rows = []
    for node in nodes:
        row = NodeRow(node=node, simulated=node.gpu_backend == "simulated")
        for gpu in node.gpus.all():
            tile = Tile(gpu.index, gpu.model, gpu.memory_mb, holders.get((node.pk, gpu.index), []))
            row.busy += bool(tile.jobs)
            sample = samples.get((node.pk, gpu.index)) if samples else None
            if sample:
                _fill(tile, sample, now)
            row.tiles.append(tile)
        rows.append(row)
    return rows, bool(samples)


def _fill(tile: Tile, sample: dict[str, Any], now: float) -> None:
    util = sample.get("util_percent")
    tile.util = None if util is None else round(util)
    tile.util_class = util_class(util)
    used = sample.get("memory_used_mb")
    total = sample.get("memory_total_mb") or tile.memory_mb
    if used is not None and total:
        tile.mem_used_mb = int(used)
        tile.mem_percent = min(100, round(100 * used / total))
    temp = sample.get("temperature_c")
    tile.temperature = None if temp is None else round(temp)
    power = sample.get("power_w")
    tile.power = None if power is None else round(power)
    at = sample_time(sample.get("sampled_at"))
    tile.stale = at is not None and now - at > STALE_SECONDS


def sample_time(value: Any) -> float | None:
    """Seconds since the epoch of a reading's `sampled_at` (ISO text or a number)."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    parsed = parse_datetime(str(value))
    return parsed.timestamp() if parsed else None


def _page(request: HttpRequest) -> tuple[Any, int, str]:
    try:
        per_page = max(1, min(MAX_PER_PAGE, int(request.GET.get("per_page", PER_PAGE))))
    except ValueError:
        per_page = PER_PAGE
    state = request.GET.get("state", "")
    nodes = node_list().defer("labels")
    if state in NodeState.values:
        nodes = nodes.filter(state=state)
    page = Paginator(nodes, per_page).get_page(request.GET.get("page"))
    return page, per_page, state


def fleet_context(request: HttpRequest) -> dict[str, Any]:
    page, per_page, state = _page(request)
    rows, has_telemetry = build_rows(list(page.object_list), time.time())
    return {
        "page": page,
        "rows": rows,
        "has_telemetry": has_telemetry,
        "totals": fleet_totals(),
        "per_page": per_page,
        "state": state,
        "states": NodeState.values,
        "poll": live.POLL_SECONDS,
    }


def _grid_html(request: HttpRequest) -> str:
    key = f"fleet:{request.GET.urlencode()}"
    return live.shared_fragment(
        key,
        lambda: render_to_string("partials/fleet_grid.html", fleet_context(request)),
    )


@member_required
def fleet_page(request: HttpRequest) -> HttpResponse:
    if live.is_partial(request):
        return HttpResponse(_grid_html(request))
    return render(
        request,
        "web/fleet.html",
        {
            "grid": _grid_html(request),
            "query": request.GET.urlencode(),
            "states": NodeState.values,
            "state": request.GET.get("state", ""),
        },
    )
