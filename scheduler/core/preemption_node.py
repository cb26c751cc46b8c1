"""The cheapest victims on one node: which running jobs' shares, once stopped, let a
waiting job fit there, what they lose, and a floor under what any such set loses (which
lets the search in scheduler.core.preemption pass over nodes that cannot win)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scheduler.core._capacity_index import host_request
from scheduler.core.model import FULL_COMPUTE, GpuState, Member, RunningJob
from scheduler.core.placement import FreeCapacity
from scheduler.core.preemption_cost import lost_work


@dataclass(frozen=True, slots=True)
class Victims:
    """Running jobs to stop so that a waiting job fits, where it will go, and what they lose."""

    node: str
    gpu_indices: tuple[int, ...]  # where the pending job will go once the victims are gone
    jobs: tuple[RunningJob, ...]
    lost_gpu_seconds: float
    # Further members of a multi-node gang (rank order), each on its own node.
    members: tuple[Member, ...] = ()

    @property
    def allocations(self) -> tuple[Member, ...]:
        return (Member(self.node, self.gpu_indices), *self.members)


# A victim's share of one node: the job and its GPU indices there.
Share = tuple[RunningJob, tuple[int, ...]]


# Relative slack for comparing a floor summed in one order with a set's cost summed in
# another: only a floor above the best set by more than rounding can rule a node out.
ROUNDING = 1e-9


def least_possible(
    k: int,
    cap: FreeCapacity,
    node: str,
    shares: list[Share],
    eligible: dict[int, GpuState],
    now: float,
    price: Callable[[RunningJob, float], float],
) -> float:
    """A floor under what any set of these victims that frees `k` whole GPUs on the node
    loses (inf where even all of them cannot): the GPUs still missing after those free now
    need at least as many victims as the largest shares would take, and those cost at least
    the cheapest victims' sum."""
    sizes = [sum(1 for i in v[1] if i in eligible) for v in shares]
    largest = max(sizes, default=0)
    if largest >= k:
        return 0.0  # one victim may do: no floor above the node's cheapest victim
    free_now = 0
    for i, g in eligible.items():
        mem, comp = cap.free_on(node, i)
        if comp >= FULL_COMPUTE and mem >= g.memory_mb:
            free_now += 1
    missing = k - free_now
    if missing <= largest:
        return 0.0
    sizes.sort(reverse=True)
    count = 0
    for size in sizes:
        count += 1
        missing -= size
        if missing <= 0:
            break
    if missing > 0:
        return float("inf")
    return sum(sorted(price(v[0], now) for v in shares)[:count])


def ordered_shares(
    shares: list[Share], now: float, cost: Callable[[RunningJob, float], float] | None = None
) -> list[Share]:
    if cost is not None:
        return sorted(shares, key=lambda s: (cost(s[0], now), s[0].gpu_equivalent, s[0].id))
    return sorted(shares, key=lambda s: (now - s[0].started_at, s[0].gpu_equivalent, s[0].id))


def on_node(
    job: Any,
    k: int,
    cap: FreeCapacity,
    node: str,
    ordered: list[Share],
    eligible: dict[int, GpuState],
    now: float,
    price: Callable[[RunningJob, float], float] = lost_work,
    *,
    as_is: bool = False,
) -> Victims | None:
    """The cheapest victims on one node for k whole GPUs (or a fraction); with `as_is`,
    none when the job fits there already."""
    base = {i: cap.free_on(node, i) for i in eligible}
    host = cap.host_free(node)
    now_free = set(cap.whole_free(node))
    chosen: list[Share] = []
    target = fit_after(job, k, eligible, base, host, now_free, chosen) if as_is else None
    if target is None:
        for victim in ordered:
            chosen.append(victim)
            target = fit_after(job, k, eligible, base, host, now_free, chosen)
            if target is not None:
                break
    if target is None:
        return None
    # Drop victims added early whose GPUs the job does not need after all.
    for victim in list(chosen[:-1]):
        rest = [c for c in chosen if c is not victim]
        again = fit_after(job, k, eligible, base, host, now_free, rest)
        if again is not None:
            chosen, target = rest, again
    lost = sum(price(c[0], now) for c in chosen)
    return Victims(node, target, tuple(c[0] for c in chosen), lost)


def fit_after(
    job: Any,
    k: int,
    eligible: dict[int, GpuState],
    base: dict[int, tuple[int, int]],
    host: tuple[int | None, int | None],
    now_free: set[int],
    gone: list[Share],
) -> tuple[int, ...] | None:
    """GPU indices the job would take on the node once `gone` have released their share
    there (k whole GPUs, or a fraction), or None; host CPUs and memory must fit too."""
    cpus, ram = host_request(job)
    if cpus or ram:
        free_cpus, free_ram = host
        for victim, _ in gone:
            v_cpus, v_ram = host_request(victim)
            free_cpus = None if free_cpus is None else free_cpus + v_cpus
            free_ram = None if free_ram is None else free_ram + v_ram
        if (free_cpus is not None and free_cpus < cpus) or (
            free_ram is not None and free_ram < ram
        ):
            return None
    free = {i: list(v) for i, v in base.items()}
    for victim, indices in gone:
        for idx in indices:
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
        for whole in by_kind.values():
            if len(whole) >= k:
                # Prefer GPUs free already, so that fewer victims are needed in practice.
                whole.sort(key=lambda i: (i not in now_free, i))
                return tuple(sorted(whole[:k]))
        return None
    need_mem, need_comp = max(job.gpu_memory_mb or 0, 1), max(job.gpu_compute_percent or 0, 1)
    for idx in sorted(eligible):
        mem, comp = free[idx]
        if mem >= need_mem and comp >= need_comp:
            return (idx,)
    return None
