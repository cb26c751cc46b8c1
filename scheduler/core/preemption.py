"""Choosing which running jobs to preempt so that a pending job fits.

Who may be preempted is the caller's rule (a team reclaiming its guarantee from
borrowers, a higher QoS over a lower one, least attained service); this module only picks,
among the allowed victims, the set that loses the least work: on each node, victims are
taken by least elapsed run time first (then fewest GPUs) until the job fits, then any
victim the job turns out not to need is dropped again. All victims of a one-node job sit
on the node it will use. The node whose set loses the least work (GPU-seconds run so far)
wins, fewer victims breaking ties.

What a preemption costs is `PreemptionCost` (settings "preemption_restart_overhead",
"preemption_checkpoints", "preemption_checkpoint_interval", "preemption_max_per_job"): the
restart overhead plus the progress the victim loses (all of this attempt without
checkpoints, only the time since its last checkpoint with them; `RunningJob.checkpointed`
says which for a job known either way, the settings for the rest), in GPU-seconds; victims are
ranked by that cost, and a job preempted `max_per_job` times is not preempted again. The
policies that preempt for efficiency (las, gittins) preempt only when the gain pays for it:
the waiting job's expected remaining service (`mean_residual`) plus the cost is below the
victim's; gittins also requires that the progress thrown away be at most `loss_bound` times
the waiting job's expected remaining service (`loses_too_much`).

A multi-node gang needs that on as many nodes as it has members, all with GPUs of one kind
(and in one group when it says same_group): per node the cheapest set is found the same
way (nothing, where a member fits already), and the cheapest nodes are taken. A running
multi-node job preempted frees all its members; it counts on every node it spans, and its
lost work is the whole gang's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core._capacity_index import host_request, node_count, per_node_gpus
from scheduler.core.model import FULL_COMPUTE, GpuState, Member, RunningJob
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
    # Further members of a multi-node gang (rank order), each on its own node.
    members: tuple[Member, ...] = ()

    @property
    def allocations(self) -> tuple[Member, ...]:
        return (Member(self.node, self.gpu_indices), *self.members)


# A victim's share of one node: the job and its GPU indices there.
Share = tuple[RunningJob, tuple[int, ...]]


def lost_work(job: RunningJob, now: float) -> float:
    return max(0.0, now - job.started_at) * job.gpu_equivalent


# Defaults of the preemption cost settings (scheduler/cycle/params.py declares them).
RESTART_OVERHEAD_DEFAULT = 60.0  # seconds a restarted job spends before useful work
CHECKPOINT_INTERVAL_DEFAULT = 0.0  # with checkpoints: 0 means continuous (nothing lost)
MAX_PER_JOB_DEFAULT = 10  # preemptions a job may suffer; 0: no cap
# The lost work counts this many times: the victim redoes it, and while it does the fleet
# lacks that capacity for every other waiting job; and the expected remaining service of a
# job deep in a heavy tail is a guess, the lost work is certain. 8 measured best on the
# Philly bench (bench/RESULTS.md, "Preemption that pays for itself").
COST_WEIGHT_DEFAULT = 8.0
# A preemption throws away at most this many times the GPU-seconds the waiting job is
# expected to need (`PreemptionCost.loss_bound`). The exchange argument weighs the lost
# progress against the victim's expected remaining service, which deep in a heavy tail is a
# guess of hundreds of GPU-hours; what the waiting job gains is bounded by its own size and
# wait, and a job of minutes should not cost the fleet hours of redone work. 16 measured
# against none on the Philly bench without checkpoints (bench/RESULTS.md, "Preemption
# without checkpoints"); a job that checkpoints continuously loses nothing and always passes.
LOSS_BOUND_DEFAULT = 16.0


@dataclass(frozen=True, slots=True)
class PreemptionCost:
    """What stopping a running job costs, in GPU-seconds, and whether it may be stopped.

    Cost = (restart overhead + progress lost) x the job's GPUs. Without checkpoints
    (`checkpoints` false, fleet's default: a preempted job restarts from scratch) the
    progress lost is the whole run time of this attempt; with them, the time since the last
    checkpoint, taken every `checkpoint_interval` seconds from the attempt's start (0: the
    job checkpoints continuously and loses nothing). A job that says whether it checkpoints
    (`RunningJob.checkpointed` true or false: production knows it once an attempt of the job
    resumed, or a later one started fresh) is costed so; `checkpoints` decides for the jobs
    that have not said (None). A job already preempted `max_per_job`
    times (0: no cap) is not preempted again, so no job is starved by churn.
    """

    restart_overhead: float = RESTART_OVERHEAD_DEFAULT
    checkpoints: bool = False
    checkpoint_interval: float = CHECKPOINT_INTERVAL_DEFAULT
    max_per_job: int = MAX_PER_JOB_DEFAULT
    cost_weight: float = COST_WEIGHT_DEFAULT
    loss_bound: float = LOSS_BOUND_DEFAULT

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> PreemptionCost:
        def get(key: str, default: Any) -> Any:
            value = settings.get(key)
            return default if value is None else value

        return cls(
            restart_overhead=max(
                0.0, float(get("preemption_restart_overhead", RESTART_OVERHEAD_DEFAULT))
            ),
            checkpoints=bool(get("preemption_checkpoints", False)),
            checkpoint_interval=max(
                0.0, float(get("preemption_checkpoint_interval", CHECKPOINT_INTERVAL_DEFAULT))
            ),
            max_per_job=max(0, int(get("preemption_max_per_job", MAX_PER_JOB_DEFAULT))),
            cost_weight=max(0.0, float(get("preemption_cost_weight", COST_WEIGHT_DEFAULT))),
            loss_bound=max(0.0, float(get("preemption_loss_bound", LOSS_BOUND_DEFAULT))),
        )

    def keeps_checkpoints(self, job: RunningJob) -> bool:
        """Whether the job resumes from a checkpoint: its own word, else the setting."""
        known = getattr(job, "checkpointed", None)
        return self.checkpoints if known is None else bool(known)

    def lost_seconds(self, job: RunningJob, now: float) -> float:
        """Seconds of this attempt's progress a preemption now would throw away."""
        ran = max(0.0, now - job.started_at)
        if not self.keeps_checkpoints(job):
            return ran
        if self.checkpoint_interval <= 0:
            return 0.0
        return ran % self.checkpoint_interval

    def lost_gpu_seconds(self, job: RunningJob, now: float) -> float:
        """GPU-seconds of this attempt's progress a preemption now would throw away."""
        return self.lost_seconds(job, now) * job.gpu_equivalent

    def loses_too_much(self, job: RunningJob, now: float, waiting_remaining: float) -> bool:
        """Whether preempting `job` would throw away more than `loss_bound` times the
        GPU-seconds the waiting job is expected to need (`waiting_remaining`); never with
        `loss_bound` 0 (no bound)."""
        if not self.loss_bound:
            return False
        return self.lost_gpu_seconds(job, now) > self.loss_bound * waiting_remaining

    def seconds(self, job: RunningJob, now: float) -> float:
        return self.restart_overhead + self.lost_seconds(job, now)

    def gpu_seconds(self, job: RunningJob, now: float) -> float:
        return self.seconds(job, now) * job.gpu_equivalent

    def capped(self, job: Any) -> bool:
        """Whether the job has been preempted as often as allowed."""
        return self.max_per_job > 0 and getattr(job, "preemptions", 0) >= self.max_per_job

    def pays(
        self, waiting_remaining: float, victim_remaining: float, victim: RunningJob, now: float
    ) -> str | None:
        """Why preempting `victim` for a job expected to need `waiting_remaining` more
        GPU-seconds pays (the victim is expected to need `victim_remaining`), or None.

        The exchange argument behind SRPT and Gittins: running the smaller remainder first
        saves the difference, and the preemption throws away its cost; it pays when the
        difference is larger than the cost, counted `cost_weight` times (the victim redoes
        the work, and meanwhile that capacity is missing for everyone else). gittins
        also asks `loses_too_much`."""
        cost = self.gpu_seconds(victim, now)
        if waiting_remaining + self.cost_weight * cost < victim_remaining:
            times = "" if self.cost_weight == 1 else f"{self.cost_weight:g} x "
            return (
                f"expected to need {gpu_hours(victim_remaining)} more against "
                f"{gpu_hours(waiting_remaining)}, which beats {times}the preemption's cost of "
                f"{gpu_hours(cost)} ({self.explain(victim, now)})"
            )
        return None

    def explain(self, job: RunningJob, now: float) -> str:
        lost = self.lost_seconds(job, now)
        if not self.keeps_checkpoints(job):
            what = f"{_secs(lost)} of progress without a checkpoint"
        elif lost <= 0:
            what = "nothing lost past its checkpoint"
        else:
            what = f"{_secs(lost)} since its last checkpoint"
        return f"{_secs(self.restart_overhead)} restart + {what}"


def gpu_hours(gpu_seconds: float) -> str:
    return f"{gpu_seconds / 3600:.3g} GPU-h"


def _secs(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def mean_residual(atoms: Sequence[float], attained: float, cap: float = math.inf) -> float:
    """Expected GPU-seconds still to come for a job that has attained `attained`, when job
    sizes follow the equal-mass `atoms` (sorted) and the job cannot exceed `cap`:
    E[min(S, cap) - a | S > a]. With no atom above `attained` (older than anything seen), or
    no atoms at all, it is `attained` again, capped (a heavy tail's rule of thumb: a job
    is expected to run as long again as it has)."""
    a = max(0.0, attained)
    if cap <= a:
        return 0.0
    total = 0.0
    count = 0
    for s in reversed(atoms):
        if s <= a:
            break
        total += min(s, cap) - a
        count += 1
    if not count:
        return min(a, cap - a)
    return total / count


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
    by_node: dict[str, list[Share]] = {}
    least: dict[str, float] = {}  # per node, the least work one of its victims would lose
    schedulable: dict[str, bool] = {}
    price = cost or lost_work
    for victim in allowed:
        lost = price(victim, now)
        spots = (
            [(victim.node, victim.gpu_indices)]
            if not victim.members
            else [(m.node, m.gpu_indices) for m in victim.allocations]
        )
        for node, indices in spots:
            ok = schedulable.get(node)
            if ok is None:
                ok = schedulable[node] = cap.is_schedulable(node)
            if not ok:
                continue
            on_node = by_node.get(node)
            if on_node is None:
                by_node[node] = [(victim, indices)]
                least[node] = lost
            else:
                on_node.append((victim, indices))
                if lost < least[node]:
                    least[node] = lost
    if node_count(job) > 1:
        return _for_gang(job, cap, by_node, least, now, max_nodes, price)
    k = max(job.gpus, 1)
    ranked = [(least[node], node, victims) for node, victims in by_node.items()]
    ranked.sort(key=lambda item: (item[0], item[1]))
    best: Victims | None = None
    visited = 0
    for bound, node, shares in ranked:
        if visited >= max_nodes or (best is not None and bound > best.lost_gpu_seconds):
            break
        eligible = {g.index: g for g in cap.node_gpus(node) if cap.eligible(job, node, g)}
        shares = [v for v in shares if any(i in eligible for i in v[1])]
        if not shares or len(eligible) < k:
            continue
        visited += 1
        ordered = _ordered(shares, now, cost)
        found = _on_node(job, k, cap, node, ordered, eligible, now, price)
        if found is None:
            continue
        key = (found.lost_gpu_seconds, len(found.jobs))
        if best is None or key < (best.lost_gpu_seconds, len(best.jobs)):
            best = found
    return best


def _ordered(
    shares: list[Share], now: float, cost: Callable[[RunningJob, float], float] | None = None
) -> list[Share]:
    if cost is not None:
        return sorted(shares, key=lambda s: (cost(s[0], now), s[0].gpu_equivalent, s[0].id))
    return sorted(shares, key=lambda s: (now - s[0].started_at, s[0].gpu_equivalent, s[0].id))


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
            ordered = _ordered(shares, now, None if price is lost_work else price)
            found = _on_node(job, per, cap, node, ordered, eligible, now, price, as_is=True)
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


def _on_node(
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
    target = _fit_after(job, k, eligible, base, host, now_free, chosen) if as_is else None
    if target is None:
        for victim in ordered:
            chosen.append(victim)
            target = _fit_after(job, k, eligible, base, host, now_free, chosen)
            if target is not None:
                break
    if target is None:
        return None
    # Drop victims added early whose GPUs the job does not need after all.
    for victim in list(chosen[:-1]):
        rest = [c for c in chosen if c is not victim]
        again = _fit_after(job, k, eligible, base, host, now_free, rest)
        if again is not None:
            chosen, target = rest, again
    lost = sum(price(c[0], now) for c in chosen)
    return Victims(node, target, tuple(c[0] for c in chosen), lost)


def _fit_after(
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
