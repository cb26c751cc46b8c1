"""Choosing which running jobs to preempt so that a pending job fits.

Who may be preempted is the caller's rule (a team reclaiming its guarantee from
borrowers, a higher QoS over a lower one, least attained service); this module only picks,
among the allowed victims, the set that loses the least work: on each node, victims are
taken by least elapsed run time first (then fewest GPUs) until the job fits, then any
victim the job turns out not to need is dropped again. All victims of a one-node job sit
on the node it will use. The node whose set loses the least work (GPU-seconds run so far)
wins, fewer victims breaking ties.

What a preemption costs, and when it pays, is `scheduler.core.preemption_cost`.

A multi-node gang needs that on as many nodes as it has members, all with GPUs of one kind
(and in one group when it says same_group): per node the cheapest set is found the same
way (nothing, where a member fits already), and the cheapest nodes are taken. A running
multi-node job preempted frees all its members; it counts on every node it spans, and its
lost work is the whole gang's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from scheduler.core._capacity_index import host_request, node_count, per_node_gpus
from scheduler.core.model import GpuState, Member, RunningJob
from scheduler.core.placement import FreeCapacity
from scheduler.core.preemption_cost import lost_work
from scheduler.core.preemption_node import (
    ROUNDING,
    Share,
    Victims,
    least_possible,
    on_node,
    ordered_shares,
)

__all__ = ["VictimIndex", "Victims", "cheapest_on_one_node", "choose_victims"]


def choose_victims(
    job: Any,
    cap: FreeCapacity,
    allowed: Iterable[RunningJob],
    now: float,
    *,
    max_nodes: int = 64,
    cost: Callable[[RunningJob, float], float] | None = None,
) -> Victims | None:
    """The cheapest set of allowed running jobs whose end lets `job` fit, or None.

    `cost(victim, now)` is what losing a victim costs (default: the GPU-seconds it has run
    in this attempt, `lost_work`); `PreemptionCost.gpu_seconds` adds restarts and counts
    checkpoints.

    Nodes are visited by the least work their cheapest victim would lose (no set on a node
    can lose less), stopping once that bound exceeds the best set found or after
    `max_nodes` nodes, which keeps a cycle bounded on large fleets.
    """
    price = cost or lost_work
    victims = list(allowed)
    by_node, names, prices, _ = _spread(victims, [price(v, now) for v in victims], cap)
    least: dict[str, float] = {}  # per node, the least work one of its victims would lose
    for node, lost in zip(names, prices, strict=True):
        if node not in least or lost < least[node]:
            least[node] = lost
    if node_count(job) > 1:
        return _for_gang(job, cap, by_node, least, now, max_nodes, price)
    ranked = [(least[node], node, victims) for node, victims in by_node.items()]
    ranked.sort(key=lambda item: (item[0], item[1]))
    return _cheapest(job, cap, ranked, now, max_nodes, cost, price)


def _cheapest(
    job: Any,
    cap: FreeCapacity,
    ranked: Iterable[tuple[float, str, list[Share]]],
    now: float,
    max_nodes: int,
    cost: Callable[[RunningJob, float], float] | None,
    price: Callable[[RunningJob, float], float],
) -> Victims | None:
    """The cheapest victims for a one-node job over (bound, node, allowed shares) in the
    order nodes are visited, stopping once a bound exceeds the best set found or after
    `max_nodes` nodes with eligible victims."""
    k = max(job.gpus, 1)
    best: Victims | None = None
    visited = 0
    suits: dict[tuple[str, int], bool] = {}  # per GPU kind: whether it suits the job
    for bound, node, shares in ranked:
        if visited >= max_nodes or (best is not None and bound > best.lost_gpu_seconds):
            break
        eligible = {}
        for g in cap.node_gpus(node):
            kind = (g.model, g.memory_mb)
            ok = suits.get(kind)
            if ok is None:
                ok = suits[kind] = cap.eligible(job, node, g)
            if ok:
                eligible[g.index] = g
        shares = [v for v in shares if any(i in eligible for i in v[1])]
        if not shares or len(eligible) < k:
            continue
        visited += 1
        if best is not None and k > 1:
            # No set on this node can beat the best one: skipped, still counted as visited
            # (the nodes searched are the same as without this test).
            floor = least_possible(k, cap, node, shares, eligible, now, price)
            if floor > best.lost_gpu_seconds * (1.0 + ROUNDING):
                continue
        ordered = ordered_shares(shares, now, cost)
        found = on_node(job, k, cap, node, ordered, eligible, now, price)
        if found is None:
            continue
        key = (found.lost_gpu_seconds, len(found.jobs))
        if best is None or key < (best.lost_gpu_seconds, len(best.jobs)):
            best = found
    return best


class VictimIndex:
    """One cycle's preemptible running jobs by node, and their spots (a job per node it
    runs on) from the cheapest to preempt up: `cheapest_on_one_node` walks nodes in the
    order `choose_victims` ranks them and stops where that does, instead of first grouping
    every allowed victim. What a victim costs and which nodes are schedulable do not change
    within a cycle; which victims are allowed does (the caller's predicate says)."""

    __slots__ = ("by_node", "order", "prices", "names", "victims", "cost")

    def __init__(
        self,
        running: Sequence[RunningJob],
        lost: Sequence[float],
        cap: FreeCapacity,
        cost: Callable[[RunningJob, float], float],
    ) -> None:
        """`lost`: cost(victim, now) of each running job, in order (as
        `PreemptionCost.columns` gives them at once); `cost` prices victims for the search."""
        self.cost = cost
        by_node, names, prices, victims = _spread(running, lost, cap)
        rank = {name: i for i, name in enumerate(sorted(by_node))}
        codes = np.fromiter((rank[n] for n in names), np.int64, len(names))
        # Spots by cost, then node name (read lazily: a search rarely goes far).
        self.order: list[int] = np.lexsort((codes, np.array(prices))).tolist()
        self.by_node, self.names, self.prices, self.victims = by_node, names, prices, victims


def cheapest_on_one_node(
    job: Any,
    cap: FreeCapacity,
    index: VictimIndex,
    allowed: Callable[[RunningJob], bool],
    now: float,
    *,
    max_nodes: int = 64,
) -> Victims | None:
    """`choose_victims(job, cap, [v for v in running if allowed(v)], now, cost=index.cost)`
    for a one-node job, asking `allowed` only about the victims of the nodes it reaches.

    A node's bound is the cost of its cheapest allowed victim, so the first allowed spot
    of each node in the index's order (cost, then node name) meets the nodes in the order
    `choose_victims` sorts them into."""
    price = index.cost
    answers: dict[int, bool] = {}

    def ok(victim: RunningJob) -> bool:
        found = answers.get(victim.id)
        if found is None:
            found = answers[victim.id] = allowed(victim)
        return found

    def ranked() -> Iterator[tuple[float, str, list[Share]]]:
        names, prices, victims = index.names, index.prices, index.victims
        reached: set[str] = set()
        for i in index.order:
            node = names[i]
            if node in reached or not ok(victims[i]):
                continue
            reached.add(node)
            yield prices[i], node, [v for v in index.by_node[node] if ok(v[0])]

    return _cheapest(job, cap, ranked(), now, max_nodes, price, price)


def _spread(
    running: Sequence[RunningJob], lost: Sequence[float], cap: FreeCapacity
) -> tuple[dict[str, list[Share]], list[str], list[float], list[RunningJob]]:
    """The running jobs' shares by schedulable node, and per spot (a job on one node it
    runs on, in order) the node, the job's cost (`lost`, in the order of `running`) and
    the job."""
    by_node: dict[str, list[Share]] = {}
    names: list[str] = []
    prices: list[float] = []
    victims: list[RunningJob] = []
    schedulable: dict[str, bool] = {}
    for victim, price in zip(running, lost, strict=True):
        for node, indices in _spots(victim):
            ok = schedulable.get(node)
            if ok is None:
                ok = schedulable[node] = cap.is_schedulable(node)
            if not ok:
                continue
            share = by_node.get(node)
            if share is None:
                by_node[node] = [(victim, indices)]
            else:
                share.append((victim, indices))
            names.append(node)
            prices.append(price)
            victims.append(victim)
    return by_node, names, prices, victims


def _spots(victim: RunningJob) -> Iterable[tuple[str, tuple[int, ...]]]:
    """(node, GPU indices) of each node the running job occupies."""
    if not victim.members:
        return ((victim.node, victim.gpu_indices),)
    return [(m.node, m.gpu_indices) for m in victim.allocations]


def _for_gang(
    job: Any,
    cap: FreeCapacity,
    by_node: dict[str, list[Share]],
    least: dict[str, float],
    now: float,
    max_nodes: int,
    price: Callable[[RunningJob, float], float] = lost_work,
) -> Victims | None:
    """Victims freeing a member's worth on enough distinct nodes, GPUs of one kind.

    Nodes holding a member already come first (they cost nothing), then nodes by the least
    work their cheapest victim would lose; at most `max_nodes` nodes beyond those the gang
    needs are searched for victims, which keeps a cycle bounded on large fleets."""
    need, per = node_count(job), per_node_gpus(job)
    cpus, ram = host_request(job)
    same_group = bool(getattr(job, "same_group", False))
    per_kind: dict[tuple[str, int], list[tuple[float, int, str, Victims]]] = {}
    free_fit: list[str] = []
    for node in cap.node_names():
        if node in least or not cap.is_schedulable(node):
            continue
        free_cpus, free_ram = cap.host_free(node)
        if (free_cpus is not None and free_cpus < cpus) or (
            free_ram is not None and free_ram < ram
        ):
            continue
        if len(cap.whole_free(node)) >= per:
            free_fit.append(node)
    ranked = sorted(least, key=lambda n: (least[n], n))[: max_nodes + need]
    for node in free_fit + ranked:
        kinds: dict[tuple[str, int], dict[int, GpuState]] = {}
        for g in cap.node_gpus(node):
            if cap.eligible(job, node, g):
                kinds.setdefault((g.model, g.memory_mb), {})[g.index] = g
        for kind, eligible in kinds.items():
            if len(eligible) < per:
                continue
            shares = [v for v in by_node.get(node, ()) if any(i in eligible for i in v[1])]
            ordered = ordered_shares(shares, now, None if price is lost_work else price)
            found = on_node(job, per, cap, node, ordered, eligible, now, price, as_is=True)
            if found is not None:
                entry = (found.lost_gpu_seconds, len(found.jobs), node, found)
                per_kind.setdefault(kind, []).append(entry)
    best: tuple[tuple[float, int], list[Victims]] | None = None
    for entries in per_kind.values():
        entries.sort(key=lambda e: e[:3])
        pools: dict[str, list[Victims]] = {}
        if same_group:
            for entry in entries:
                group = cap.group_of(entry[2])
                if group:
                    pools.setdefault(group, []).append(entry[3])
        else:
            pools[""] = [e[3] for e in entries]
        for chosen in pools.values():
            if len(chosen) < need:
                continue
            picked = chosen[:need]
            jobs = {j.id: j for v in picked for j in v.jobs}
            key = (sum(price(j, now) for j in jobs.values()), len(jobs))
            if best is None or key < best[0]:
                best = (key, picked)
    if best is None:
        return None
    (lost, count), picked = best
    if not count:
        return None  # it fits without victims: nothing for preemption to do
    victims = tuple({j.id: j for v in picked for j in v.jobs}.values())
    first, rest = picked[0], picked[1:]
    return Victims(
        first.node,
        first.gpu_indices,
        victims,
        lost,
        tuple(Member(v.node, v.gpu_indices) for v in rest),
    )
