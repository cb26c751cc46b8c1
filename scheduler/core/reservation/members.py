"""The reservation sweep for a multi-node gang, or a one-node job that asks for host CPUs or
memory on a fleet that reports them: GPU and host releases in time order, until enough
distinct nodes each hold a member."""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heapify, heappop
from typing import Any

from scheduler.core._capacity_index import host_request, node_count, per_node_gpus
from scheduler.core.model import FULL_COMPUTE, Member
from scheduler.core.placement import FreeCapacity, Members, spread
from scheduler.core.reservation.occupants import Occupant


def kind_eligibility(job: Any, cap: FreeCapacity) -> Callable[[str, Any], bool]:
    """Whether a GPU's model and memory suit the job, asked of `cap` once per kind (model,
    memory)."""
    kind_ok: dict[tuple[str, int], bool] = {}

    def eligible(node: str, gpu: Any) -> bool:
        key = (gpu.model, gpu.memory_mb)
        ok = kind_ok.get(key)
        if ok is None:
            ok = kind_ok[key] = cap.eligible(job, node, gpu)
        return ok

    return eligible


def host_bound(job: Any, cap: FreeCapacity) -> bool:
    cpus, memory_mb = host_request(job)
    return bool(cpus or memory_mb) and cap.host_limited()


def earliest_start_members(
    job: Any, cap: FreeCapacity, occupants: list[Occupant], now: float
) -> tuple[float, Members] | None:
    """(start, members) where a job of whole GPUs could start soonest on distinct nodes,
    each holding `gpus_per_node` GPUs of one kind and the host share it asks for, or None.

    Walks GPU and host releases in time order; a node holds a member once it has enough
    wholly free GPUs of a kind the job may use and enough free CPUs and memory. Members
    are picked as best_fit_members picks them (fewest groups, then tightest nodes).
    """
    need, per = node_count(job), per_node_gpus(job)
    cpus, ram = host_request(job)
    same_group = bool(getattr(job, "same_group", False))
    eligible = kind_eligibility(job, cap)

    # Free now: wholly free eligible GPUs per (node, kind), host per node.
    free: dict[tuple[str, tuple[str, int]], list[int]] = {}
    host: dict[str, list[float]] = {}
    for node in cap.node_names():
        if not cap.is_schedulable(node):
            continue
        c, m = cap.host_free(node)
        host[node] = [math.inf if c is None else c, math.inf if m is None else m]
        whole = set(cap.whole_free(node))
        for gpu in cap.node_gpus(node):
            if gpu.index in whole and eligible(node, gpu):
                free.setdefault((node, (gpu.model, gpu.memory_mb)), []).append(gpu.index)
    # Per busy eligible GPU: when it is wholly free again; per node: host given back.
    last: dict[tuple[str, int], float] = {}
    gang: set[tuple[str, int]] = set()
    back: dict[tuple[str, int], list[int]] = {}
    # (when, 0 for a GPU or 1 for host room, node, position, then the GPU index and the GPU,
    # or the CPUs and memory): in the order of a stable sort by the first three, since the
    # position breaks ties; `end if end > now else now` is max(now, end) without the call.
    events: list[tuple[float, int, str, int, Any, Any]] = []
    for occ in occupants:
        if occ.node not in host:
            continue
        if occ.cpus or occ.memory_mb:
            end = occ.end
            when = end if end > now else now
            events.append((when, 1, occ.node, len(events), occ.cpus, occ.memory_mb))
        for idx in occ.gpu_indices:
            where = (occ.node, idx)
            if occ.end > last.get(where, -math.inf):
                last[where] = occ.end
            if occ.gpus:
                gang.add(where)
            else:
                amounts = back.setdefault(where, [0, 0])
                amounts[0] += occ.gpu_memory_mb or 0
                amounts[1] += occ.gpu_compute_percent or 0
    for (node, idx), end in last.items():
        held = cap.gpus_by_index(node).get(idx)
        if held is None or not eligible(node, held):
            continue
        if (node, idx) not in gang:
            mem, comp = cap.free_on(node, idx)
            add_mem, add_comp = back[(node, idx)]
            if not (comp + add_comp >= FULL_COMPUTE and mem + add_mem >= held.memory_mb):
                continue
        events.append((end if end > now else now, 0, node, len(events), idx, held))
    # Popped in time order: most often only the first few are looked at.
    heapify(events)

    def host_ok(node: str) -> bool:
        c, m = host[node]
        return c >= cpus and m >= ram

    # Per kind, the nodes holding a member now; kept up to date for the nodes an event
    # touches, so each step costs what changed, not a pass over the fleet.
    kinds_of: dict[str, list[tuple[str, int]]] = {}
    for node, kind in free:
        kinds_of.setdefault(node, []).append(kind)
    ready: dict[tuple[str, int], set[str]] = {}

    def refresh(node: str) -> None:
        ok = host_ok(node)
        for kind in kinds_of.get(node, ()):
            nodes = ready.setdefault(kind, set())
            if ok and len(free[(node, kind)]) >= per:
                nodes.add(node)
            else:
                nodes.discard(node)

    for node in kinds_of:
        refresh(node)

    def attempt() -> Members | None:
        best: tuple[tuple[int, int], tuple[str, int], list[tuple[int, int]]] | None = None
        names: dict[int, str] = {}
        by_kind: dict[tuple[str, int], dict[str, list[tuple[int, int]]]] = {}
        for kind, nodes in ready.items():
            if len(nodes) < need:
                continue
            for node in sorted(nodes):
                pos = len(names)
                names[pos] = node
                groups = by_kind.setdefault(kind, {})
                groups.setdefault(cap.group_of(node), []).append((len(free[(node, kind)]), pos))
        for kind, by_group in by_kind.items():
            for cands in by_group.values():
                cands.sort()
            picked = spread(by_group, need, same_group)
            if picked is None:
                continue
            key = (picked[0], sum(c for c, _ in picked[1]))
            if best is None or key < best[0]:
                best = (key, kind, picked[1])
        if best is None:
            return None
        _, kind, chosen = best
        return tuple(
            Member(names[pos], tuple(sorted(free[(names[pos], kind)])[:per])) for _, pos in chosen
        )

    found = attempt()
    if found is not None:
        return now, found
    while events:
        when = events[0][0]
        touched = set()
        while events and events[0][0] <= when:
            _, what, node, _, a, b = heappop(events)
            if what == 0:
                kind = (b.model, b.memory_mb)
                indices = free.setdefault((node, kind), [])
                if not indices and kind not in kinds_of.setdefault(node, []):
                    kinds_of[node].append(kind)
                indices.append(a)
            else:
                host[node][0] += a
                host[node][1] += b
            touched.add(node)
        for node in touched:
            refresh(node)
        if not any(len(nodes) >= need for nodes in ready.values()):
            continue
        found = attempt()
        if found is not None:
            return when, found
    return None
