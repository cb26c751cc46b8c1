"""Choosing which running jobs to preempt so that a pending job fits.

Who may be preempted is the caller's rule (a team reclaiming its guarantee from
borrowers, a higher QoS over a lower one, least attained service); this module only picks,
among the allowed victims, the set that loses the least work: on each node, victims are
taken by least elapsed run time first (then fewest GPUs) until the job fits, then any
victim the job turns out not to need is dropped again. All victims of a gang sit on the
node the gang will use. The node whose set loses the least work (GPU-seconds run so far)
wins, fewer victims breaking ties.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from scheduler.core.model import FULL_COMPUTE, RunningJob
from scheduler.core.placement import FreeCapacity

# Settings key "qos_ranks" overrides these; a higher rank may preempt a lower one when
# settings["qos_preemption"] is true.
QOS_RANKS_DEFAULT = {"low": 0, "normal": 1, "high": 2}


@dataclass(frozen=True, slots=True)
class Victims:
    node: str
    gpu_indices: tuple[int, ...]  # where the pending job will go once the victims are gone
    jobs: tuple[RunningJob, ...]
    lost_gpu_seconds: float


def lost_work(job: RunningJob, now: float) -> float:
    return max(0.0, now - job.started_at) * job.gpu_equivalent


def qos_rank(qos: str, settings: Any) -> int:
    ranks = settings.get("qos_ranks") or QOS_RANKS_DEFAULT
    return int(ranks.get(qos, ranks.get("normal", 0)))


def choose_victims(
    job: Any, cap: FreeCapacity, allowed: Iterable[RunningJob], now: float
) -> Victims | None:
    """The cheapest set of allowed running jobs whose end lets `job` fit, or None."""
    by_node: dict[str, list[RunningJob]] = {}
    for victim in allowed:
        if cap.is_schedulable(victim.node):
            by_node.setdefault(victim.node, []).append(victim)
    best: Victims | None = None
    for node in sorted(by_node):
        victims = sorted(by_node[node], key=lambda r: (now - r.started_at, r.gpu_equivalent, r.id))
        found = _on_node(job, cap, node, victims, now)
        if found is None:
            continue
        key = (found.lost_gpu_seconds, len(found.jobs))
        if best is None or key < (best.lost_gpu_seconds, len(best.jobs)):
            best = found
    return best


def _on_node(
    job: Any, cap: FreeCapacity, node: str, ordered: list[RunningJob], now: float
) -> Victims | None:
    chosen: list[RunningJob] = []
    target = None
    for victim in ordered:
        chosen.append(victim)
        target = _fit_after(job, cap, node, chosen)
        if target is not None:
            break
    if target is None:
        return None
    # Drop victims added early whose GPUs the job does not need after all.
    for victim in list(chosen[:-1]):
        rest = [c for c in chosen if c is not victim]
        again = _fit_after(job, cap, node, rest)
        if again is not None:
            chosen, target = rest, again
    lost = sum(lost_work(c, now) for c in chosen)
    return Victims(node, target, tuple(chosen), lost)


def _fit_after(
    job: Any, cap: FreeCapacity, node: str, gone: list[RunningJob]
) -> tuple[int, ...] | None:
    """GPU indices the job would take on `node` once `gone` have released their share."""
    free: dict[int, list[int]] = {}
    for gpu in cap.node_gpus(node):
        mem, comp = cap.free_on(node, gpu.index)
        free[gpu.index] = [mem, comp]
    sizes = {gpu.index: gpu.memory_mb for gpu in cap.node_gpus(node)}
    for victim in gone:
        for idx in victim.gpu_indices:
            if idx not in free:
                continue
            if victim.gpus:
                free[idx] = [sizes[idx], FULL_COMPUTE]
            else:
                free[idx][0] = min(sizes[idx], free[idx][0] + (victim.gpu_memory_mb or 0))
                free[idx][1] = min(FULL_COMPUTE, free[idx][1] + (victim.gpu_compute_percent or 0))
    gpus = [g for g in cap.node_gpus(node) if cap.eligible(job, node, g)]
    if job.gpus:
        by_kind: dict[tuple[str, int], list[int]] = {}
        for g in gpus:
            mem, comp = free[g.index]
            if comp >= FULL_COMPUTE and mem >= g.memory_mb:
                by_kind.setdefault((g.model, g.memory_mb), []).append(g.index)
        for indices in by_kind.values():
            if len(indices) >= job.gpus:
                # Prefer GPUs free already, so that fewer victims are needed in practice.
                now_free = set(cap.whole_free(node))
                indices.sort(key=lambda i: (i not in now_free, i))
                return tuple(sorted(indices[: job.gpus]))
        return None
    need_mem, need_comp = max(job.gpu_memory_mb or 0, 1), max(job.gpu_compute_percent or 0, 1)
    for g in gpus:
        mem, comp = free[g.index]
        if mem >= need_mem and comp >= need_comp:
            return (g.index,)
    return None
