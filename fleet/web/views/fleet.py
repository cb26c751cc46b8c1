"""The fleet page: every node with its GPUs as tiles, its host CPUs and memory (used of
what its agent offers) and its topology group, the fleet's GPU totals, and the free GPUs of
each group (a multi-node job fits where one group has enough). A job whose current attempt
was marked idle shows an "idle" badge on its tiles, with the time since its GPUs went idle."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from django.core.paginator import Paginator
from django.db.models import Count, F, OuterRef, Prefetch, Q, Subquery
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.dateparse import parse_datetime
from django.utils.safestring import SafeString

from fleet.models import Gpu, Job, JobMember, Node, NodeState
from fleet.models.jobs import ACTIVE_STATES
from fleet.models.notifications import JobIdle
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
    # job id -> seconds since its GPUs went idle, for held jobs whose attempt is marked idle
    idle: dict[int, float] = field(default_factory=dict)


@dataclass
class NodeRow:
    node: Node
    tiles: list[Tile] = field(default_factory=list)
    simulated: bool = False
    busy: int = 0
    cpus_used: int = 0
    memory_used_mb: int = 0

    @property
    def tiles_html(self) -> SafeString:
        return tiles_html(self.tiles)


def util_class(util: float | None) -> str:
    if util is None:
        return "util-none"
    return f"util-{min(4, int(util // 20))}"


Share = tuple[int, list[int], Job]  # (node id, GPU indices, job): one member's allocation


def active_shares(nodes: list[Node] | None = None) -> list[Share]:
    """What each assigned or running job holds, node by node: one share per member of the
    current attempt of a multi-node job, else the job's own node and GPUs. Two queries.
    `nodes`: only the jobs with a share on one of them (the shares on other nodes too).
    Each job carries `idle_at` and `idle_minutes` from the idle mark of its current attempt
    (None when unmarked), read in the same query."""
    active = Job.objects.filter(state__in=ACTIVE_STATES)
    if nodes is not None:
        active = active.filter(
            Q(node__in=nodes) | Q(members__node__in=nodes, members__attempt=F("attempt"))
        ).distinct()
    mark = JobIdle.objects.filter(job=OuterRef("pk"), attempt=OuterRef("attempt"))
    jobs = (
        active.select_related("owner")
        .only(
            "id",
            "name",
            "node_id",
            "gpu_indices",
            "attempt",
            "cpus",
            "memory_mb",
            "owner__username",
        )
        .prefetch_related(
            Prefetch(
                "members",
                queryset=JobMember.objects.only(
                    "id", "job_id", "attempt", "rank", "node_id", "gpu_indices"
                ),
            )
        )
        .annotate(
            idle_at=Subquery(mark.values("detected_at")[:1]),
            idle_minutes=Subquery(mark.values("minutes")[:1]),
        )
    )
    shares: list[Share] = []
    for job in jobs:
        members = [m for m in job.members.all() if m.attempt == job.attempt and m.node_id]
        if members:
            shares.extend((m.node_id or 0, list(m.gpu_indices or []), job) for m in members)
        elif job.node_id:
            shares.append((job.node_id, list(job.gpu_indices or []), job))
    return shares


def fleet_totals(shares: list[Share]) -> dict[str, int]:
    """Free, busy, down and draining GPUs over the whole fleet."""
    per_state = dict(
        Gpu.objects.values_list("node__state")
        .annotate(n=Count("id"))
        .values_list("node__state", "n")
    )
    states = dict(Node.objects.values_list("id", "state"))
    held: set[tuple[int, int]] = set()
    draining_busy = 0
    for node_id, indices, _job in shares:
        node_state = states.get(node_id)
        if node_state == NodeState.DOWN:
            continue
        for index in indices:
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


def gpu_holders(shares: list[Share]) -> dict[tuple[int, int], list[Job]]:
    """Which assigned or running job holds which GPU."""
    holders: dict[tuple[int, int], list[Job]] = {}
    for node_id, indices, job in shares:
        for index in indices:
            holders.setdefault((node_id, index), []).append(job)
    return holders


def free_by_group(shares: list[Share]) -> list[dict[str, Any]]:
    """For each topology group: its free GPUs on nodes that are up, and the most free on
    one node, so a person sees whether a multi-node job fits in one group."""
    held = {(node_id, index) for node_id, indices, _ in shares for index in indices}
    per_node: dict[int, int] = {}
    group_of: dict[int, str] = {}
    for node_id, index, group in Gpu.objects.filter(node__state=NodeState.UP).values_list(
        "node_id", "index", "node__group"
    ):
        group_of[node_id] = group or ""
        per_node[node_id] = per_node.get(node_id, 0) + ((node_id, index) not in held)
    groups: dict[str, dict[str, Any]] = {}
    for node_id, free in per_node.items():
        row = groups.setdefault(
            group_of[node_id], {"group": group_of[node_id], "free": 0, "largest": 0, "nodes": 0}
        )
        row["free"] += free
        row["largest"] = max(row["largest"], free)
        row["nodes"] += 1
    return sorted(groups.values(), key=lambda r: (-r["free"], r["group"]))


def build_rows(
    nodes: list[Node], now: float, shares: list[Share] | None = None
) -> tuple[list[NodeRow], bool]:
    shares = active_shares(nodes) if shares is None else shares
    holders = gpu_holders(shares)
    host_used: dict[int, list[int]] = {}
    idle: dict[int, float] = {}
    for node_id, _indices, job in shares:
        idle_at = getattr(job, "idle_at", None)
        if idle_at is not None:
            # The mark is written at the end of the idle window: the GPUs went idle then.
            went_idle = idle_at.timestamp() - 60 * (getattr(job, "idle_minutes", 0) or 0)
            idle[job.pk] = max(0.0, now - went_idle)
        used = host_used.setdefault(node_id, [0, 0])
        used[0] += job.cpus or 0
        used[1] += job.memory_mb or 0
    samples = sources.latest_samples(nodes)
    rows = []
    for node in nodes:
        row = NodeRow(node=node, simulated=node.gpu_backend == "simulated")
        row.cpus_used, row.memory_used_mb = host_used.get(node.pk, [0, 0])
        for gpu in node.gpus.all():
            tile = Tile(gpu.index, gpu.model, gpu.memory_mb, holders.get((node.pk, gpu.index), []))
            row.busy += bool(tile.jobs)
            tile.idle = {job.pk: idle[job.pk] for job in tile.jobs if job.pk in idle}
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
    shares = active_shares()
    rows, has_telemetry = build_rows(list(page.object_list), time.time(), shares)
    groups = free_by_group(shares)
    return {
        "page": page,
        "rows": rows,
        "has_telemetry": has_telemetry,
        "totals": fleet_totals(shares),
        # Worth showing only where the fleet is split into groups.
        "groups": groups if any(g["group"] for g in groups) else [],
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
