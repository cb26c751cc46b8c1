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

from scheduler.core.model import FULL_COMPUTE, GpuState, RunningJob
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
    job: Any,
    cap: FreeCapacity,
    allowed: Iterable[RunningJob],
    now: float,
    *,
    max_nodes: int = 64,
) -> Victims | None:
    """The cheapest set of allowed running jobs whose end lets `job` fit, or None.

    Nodes are visited by the least work their cheapest victim would lose (no set on a node
    can lose less), stopping once that bound exceeds the best set found or after
    `max_nodes` nodes, which keeps a cycle bounded on large fleets.
    """
    by_node: dict[str, list[RunningJob]] = {}
    least: dict[str, float] = {}  # per node, the least work one of its victims would lose
    schedulable: dict[str, bool] = {}
    for victim in allowed:
        node = victim.node
        ok = schedulable.get(node)
        if ok is None:
            ok = schedulable[node] = cap.is_schedulable(node)
        if not ok:
            continue
        lost = lost_work(victim, now)
        on_node = by_node.get(node)
        if on_node is None:
            by_node[node] = [victim]
            least[node] = lost
        else:
            on_node.append(victim)
            if lost < least[node]:
                least[node] = lost
    ranked = [(least[node], node, victims) for node, victims in by_node.items()]
    ranked.sort(key=lambda item: (item[0], item[1]))
    best: Victims | None = None
    visited = 0
    for bound, node, victims in ranked:
        if visited >= max_nodes or (best is not None and bound > best.lost_gpu_seconds):
            break
        eligible = {g.index: g for g in cap.node_gpus(node) if cap.eligible(job, node, g)}
        victims = [v for v in victims if any(i in eligible for i in v.gpu_indices)]
        if not victims or len(eligible) < max(job.gpus, 1):
            continue
        visited += 1
        victims.sort(key=lambda r: (now - r.started_at, r.gpu_equivalent, r.id))
        found = _on_node(job, cap, node, victims, eligible, now)
        if found is None:
            continue
        key = (found.lost_gpu_seconds, len(found.jobs))
        if best is None or key < (best.lost_gpu_seconds, len(best.jobs)):
            best = found
    return best


def _on_node(
    job: Any,
    cap: FreeCapacity,
    node: str,
    ordered: list[RunningJob],
    eligible: dict[int, GpuState],
    now: float,
) -> Victims | None:
    base = {i: cap.free_on(node, i) for i in eligible}
    now_free = set(cap.whole_free(node))
    chosen: list[RunningJob] = []
    target = None
    for victim in ordered:
        chosen.append(victim)
        target = _fit_after(job, eligible, base, now_free, chosen)
        if target is not None:
            break
    if target is None:
        return None
    # Drop victims added early whose GPUs the job does not need after all.
    for victim in list(chosen[:-1]):
        rest = [c for c in chosen if c is not victim]
        again = _fit_after(job, eligible, base, now_free, rest)
        if again is not None:
            chosen, target = rest, again
    lost = sum(lost_work(c, now) for c in chosen)
    return Victims(node, target, tuple(chosen), lost)


def _fit_after(
    job: Any,
    eligible: dict[int, GpuState],
    base: dict[int, tuple[int, int]],
    now_free: set[int],
    gone: list[RunningJob],
) -> tuple[int, ...] | None:
    """GPU indices the job would take on the node once `gone` have released their share."""
    free = {i: list(v) for i, v in base.items()}
    for victim in gone:
        for idx in victim.gpu_indices:
            if idx not in free:
                continue
            size = eligible[idx].memory_mb
            if victim.gpus:
                free[idx] = [size, FULL_COMPUTE]
            else:
                free[idx][0] = min(size, free[idx][0] + (victim.gpu_memory_mb or 0))
                free[idx][1] = min(FULL_COMPUTE, free[idx][1] + (victim.gpu_compute_percent or 0))
    if job.gpus:
        by_kind: dict[tuple[str, int], list[int]] = {}
        for idx, g in eligible.items():
            mem, comp = free[idx]
            if comp >= FULL_COMPUTE and mem >= g.memory_mb:
                by_kind.setdefault((g.model, g.memory_mb), []).append(idx)
        for indices in by_kind.values():
            if len(indices) >= job.gpus:
                # Prefer GPUs free already, so that fewer victims are needed in practice.
                indices.sort(key=lambda i: (i not in now_free, i))
                return tuple(sorted(indices[: job.gpus]))
        return None
    need_mem, need_comp = max(job.gpu_memory_mb or 0, 1), max(job.gpu_compute_percent or 0, 1)
    for idx in sorted(eligible):
        mem, comp = free[idx]
        if mem >= need_mem and comp >= need_comp:
            return (idx,)
    return None
