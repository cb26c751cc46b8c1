"""Where and when a job could start soonest, swept from a list of occupants (the plain path;
`ReleaseTimeline` answers the common case from state kept across cycles)."""

from __future__ import annotations

import math
from heapq import heapify, heappop
from typing import Any

from scheduler.core._capacity_index import node_count
from scheduler.core.model import FULL_COMPUTE
from scheduler.core.placement import FreeCapacity
from scheduler.core.reservation.members import earliest_start_members, host_bound, kind_eligibility
from scheduler.core.reservation.occupants import Occupant


def earliest_start(
    job: Any, cap: FreeCapacity, occupants: list[Occupant], now: float
) -> tuple[str, float, tuple[int, ...]] | None:
    """(node, start, gpu indices) where the job could start soonest, or None if never.

    A GPU counts as free for a gang once every occupant on it has ended; a fraction needs
    enough memory and compute left, releasing occupants in the order they end. For a
    multi-node gang use `earliest_start_members`.
    """
    if job.gpus and (node_count(job) > 1 or host_bound(job, cap)):
        spread_found = earliest_start_members(job, cap, occupants, now)
        if spread_found is None:
            return None
        start, members = spread_found
        return members[0].node, start, members[0].gpu_indices
    if job.gpus:
        return _gang_sweep(job, cap, occupants, now)
    on_gpu: dict[tuple[str, int], list[Occupant]] = {}
    for occ in occupants:
        for idx in occ.gpu_indices:
            on_gpu.setdefault((occ.node, idx), []).append(occ)
    best: tuple[str, float, tuple[int, ...]] | None = None
    for node in cap.node_names():
        if not cap.is_schedulable(node):
            continue
        found = _fraction_on_node(job, cap, node, on_gpu, now)
        if found is not None and (best is None or found[0] < best[1]):
            best = (node, found[0], found[1])
    return best


def _gang_sweep(
    job: Any, cap: FreeCapacity, occupants: list[Occupant], now: float
) -> tuple[str, float, tuple[int, ...]] | None:
    """Walk GPU release times in order, counting wholly free GPUs per node and kind, until
    some node holds the gang: O(busy GPUs log busy GPUs), not a pass per node."""
    eligible = kind_eligibility(job, cap)

    ready: dict[tuple[str, str, int], list[int]] = {}
    for node in cap.node_names():
        free_now = cap.whole_free(node) if cap.is_schedulable(node) else ()
        if not free_now:
            continue
        for gpu in cap.node_gpus(node):
            if gpu.index in free_now and eligible(node, gpu):
                ready.setdefault((node, gpu.model, gpu.memory_mb), []).append(gpu.index)
    for key, indices in ready.items():
        if len(indices) >= job.gpus:
            return key[0], now, tuple(indices[: job.gpus])
    # Per busy GPU: when its last occupant ends, whether a gang holds it (then it is wholly
    # free at that end), else what its fractions give back on top of what is free now.
    last: dict[tuple[str, int], float] = {}
    gang: set[tuple[str, int]] = set()
    back: dict[tuple[str, int], list[int]] = {}
    for occ in occupants:
        end, node, whole = occ.end, occ.node, occ.gpus
        for idx in occ.gpu_indices:
            where = (node, idx)
            seen = last.get(where)
            if seen is None or end > seen:
                last[where] = end
            if whole:
                gang.add(where)
            else:
                amounts = back.get(where)
                if amounts is None:
                    back[where] = [occ.gpu_memory_mb or 0, occ.gpu_compute_percent or 0]
                else:
                    amounts[0] += occ.gpu_memory_mb or 0
                    amounts[1] += occ.gpu_compute_percent or 0
    releases = []
    gpus_of: dict[str, dict[int, Any]] = {}
    for where, end in last.items():
        node, idx = where
        gpus = gpus_of.get(node)
        if gpus is None:
            gpus = gpus_of[node] = cap.gpus_by_index(node)
        held = gpus.get(idx)
        if held is None:
            continue
        if not eligible(node, held):
            continue
        if where not in gang:
            mem, comp = cap.free_on(node, idx)
            add_mem, add_comp = back[where]
            if not (comp + add_comp >= FULL_COMPUTE and mem + add_mem >= held.memory_mb):
                continue
        releases.append((end if end > now else now, node, idx, held.model, held.memory_mb))
    # In time order (each GPU once, so a heap pops what a sort lists), most often only the
    # first few are looked at.
    heapify(releases)
    need = job.gpus
    while releases:
        when, node, idx, model, memory_mb = heappop(releases)
        indices = ready.setdefault((node, model, memory_mb), [])
        indices.append(idx)
        if len(indices) >= need:
            return node, when, tuple(sorted(indices[:need]))
    return None


def _fraction_on_node(
    job: Any, cap: FreeCapacity, node: str, on_gpu: dict, now: float
) -> tuple[float, tuple[int, ...]] | None:
    need_mem, need_comp = max(job.gpu_memory_mb or 0, 1), max(job.gpu_compute_percent or 0, 1)
    best: tuple[float, tuple[int, ...]] | None = None
    for gpu in cap.node_gpus(node):
        if not cap.eligible(job, node, gpu):
            continue
        mem, comp = cap.free_on(node, gpu.index)
        when = now if (mem >= need_mem and comp >= need_comp) else math.inf
        if when == math.inf:
            for occ in sorted(on_gpu.get((node, gpu.index), ()), key=lambda o: o.end):
                add_mem, add_comp = _amount(occ, gpu.memory_mb)
                mem, comp = mem + add_mem, comp + add_comp
                if mem >= need_mem and comp >= need_comp:
                    when = max(now, occ.end)
                    break
        if when < math.inf and (best is None or when < best[0]):
            best = (when, (gpu.index,))
    return best


def _amount(occ: Occupant, memory_mb: int) -> tuple[int, int]:
    if occ.gpus:
        return memory_mb, FULL_COMPUTE
    return occ.gpu_memory_mb or 0, occ.gpu_compute_percent or 0
