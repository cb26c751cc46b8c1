"""The preemption part of the policies' shared cycle (scheduler.policies.base.Cycle): a
job that finds no room may preempt running jobs, a team within its guarantee from
borrowing teams, a higher QoS a lower one, or by the policy's own rule."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from scheduler.core._capacity_index import node_count
from scheduler.core.model import PendingJob, Preempt, RunningJob, Snapshot
from scheduler.core.placement import FreeCapacity
from scheduler.core.preemption import VictimIndex, cheapest_on_one_node, choose_victims
from scheduler.core.preemption_cost import PreemptionCost, qos_rank
from scheduler.core.quota import QuotaLedger

# A filtered victim list shorter than 1/SHORT_LIST of the preemptible jobs is asked about
# whole (the rule on each listed victim) rather than found by walking the victim index,
# which passes every preemptible job on the way to the listed ones.
SHORT_LIST = 4


class Reason:
    """Why a victim may be preempted, written out only when read: a search weighs many
    allowed victims and preempts a few, so a rule returns this instead of a string whose
    numbers would be formatted for every victim weighed."""

    __slots__ = ("_write",)

    def __init__(self, write: Callable[[], str]) -> None:
        self._write = write

    def __str__(self) -> str:
        return self._write()


# A victim rule's answer: the reason the victim may go (a string or a Reason), or None.
VictimRule = Callable[[PendingJob, RunningJob], str | Reason | None]
VictimFilter = Callable[[PendingJob, list[RunningJob]], Iterable[int]]
RuleHint = Callable[[Sequence[PendingJob], list[RunningJob]], np.ndarray]


class CyclePreemption:
    """Cycle's preemption (Cycle sets these attributes)."""

    snapshot: Snapshot
    settings: Mapping[str, Any]
    now: float
    cap: FreeCapacity
    quota: QuotaLedger
    costs: PreemptionCost
    victim_rule: VictimRule | None
    victim_filter: VictimFilter | None
    rule_key: Callable[[PendingJob], Any] | None
    preempts: list[Preempt]
    _preempted: set[int]
    _preempt_fails: set[tuple[Any, ...]]
    _victims: list[RunningJob] | None
    _team_positions: dict[str, list[int]] | None
    _victim_costs: dict[int, tuple[RunningJob, float, float]]
    fast: bool
    # The preemptible jobs by node and cost, built on the cycle's first one-node search.
    _index: VictimIndex | None = None
    _waits: dict[int, tuple[PendingJob, str, Any]]
    _reclaim_on: bool
    _qos_on: bool
    _max_preempts: int

    def _victim_reason(
        self, job: PendingJob, victim: RunningJob, borrowers: set[str], job_rank: int
    ) -> str | Reason | None:
        if victim.id in self._preempted:
            return None
        if victim.team in borrowers and victim.team != job.team:
            return f"team {job.team} reclaims its guaranteed GPUs from borrowing team {victim.team}"
        if self._qos_on and job_rank > qos_rank(victim.qos, self.settings):
            return f"QoS {job.qos} preempts QoS {victim.qos}"
        if self.victim_rule is not None:
            return self.victim_rule(job, victim)
        return None

    @property
    def _preemptible(self) -> list[RunningJob]:
        """Running jobs that may be preempted at all (listed on the first search)."""
        if self._victims is None:
            self._victims = [
                r for r in self.snapshot.running if r.preemptible and not self.costs.capped(r)
            ]
        return self._victims

    def _borrowed_from(self, teams: set[str]) -> list[list[int]]:
        """Per team, the positions of its jobs in the preemptible list."""
        if self._team_positions is None:
            self._team_positions = {}
            for i, victim in enumerate(self._preemptible):
                self._team_positions.setdefault(victim.team, []).append(i)
        return [self._team_positions.get(t, []) for t in teams]

    def _victim_cost(self, victim: RunningJob, now: float) -> float:
        """`PreemptionCost.gpu_seconds`, kept per victim object for the cycle (a cycle's
        searches price the same running jobs again and again)."""
        known = self._victim_costs.get(id(victim))
        if known is None or known[0] is not victim or known[1] != now:
            known = self._victim_costs[id(victim)] = (
                victim,
                now,
                self.costs.gpu_seconds(victim, now),
            )
        return known[2]

    def _victim_index(self) -> VictimIndex:
        """The preemptible jobs by node and by cost (built on the cycle's first search)."""
        if self._index is None:
            jobs = self._preemptible
            lost, _ = self.costs.columns(jobs, self.now)
            self._index = VictimIndex(jobs, lost.tolist(), self.cap, self._victim_cost)
        return self._index

    def try_preempt(self, job: PendingJob) -> bool:
        """Preempt the cheapest allowed victims so the job fits in a later cycle.

        At most settings["max_preemptions_per_cycle"] (default 32) victims per cycle, so a
        burst of small jobs cannot evict the whole fleet at once; a request shape that
        found no victims is not searched again in the same cycle.
        """
        releasing = self.snapshot.releasing_for.get(job.id)
        if releasing is not None:
            # Jobs preempted for it in an earlier cycle are still stopping: it waits for
            # their GPUs rather than preempting another set.
            self.quota.take(job)
            self._waits[job.id] = (job, "releasing", releasing)
            return True
        if len(self.preempts) >= self._max_preempts:
            return False
        within = self._reclaim_on and self.quota.within_guarantee(job)
        if not (within or self._qos_on or self.victim_rule is not None):
            return False
        key = (
            FreeCapacity.shape(job),
            job.team,
            job.qos,
            within,
            self.rule_key and self.rule_key(job),
        )
        if key in self._preempt_fails:
            return False
        borrowers = (
            {t for t in self.quota.team_usage if self.quota.borrowing(t) > 0} if within else set()
        )
        job_rank = qos_rank(job.qos, self.settings)
        candidates = self._preemptible
        if self.victim_filter is not None and not self._qos_on:
            # Only the borrowers' jobs and the rule's candidates can be allowed here, so
            # only those are asked, in the list's order.
            chosen = self.victim_filter(job, candidates)
            if borrowers:
                chosen = sorted(set(chosen).union(*self._borrowed_from(borrowers - {job.team})))
            candidates = [candidates[i] for i in chosen]
        reasons: dict[int, str | Reason | None] = {}
        whole = candidates is self._preemptible
        if (
            self.fast
            and node_count(job) == 1
            and (whole or len(candidates) * SHORT_LIST >= len(self._preemptible))
        ):
            # Ask the rule only about the victims on the nodes the search reaches (of a
            # filtered list, only those in it: a team reclaiming its guarantee from many
            # borrowers lists most running jobs). A short list (an empty one, often) is
            # asked about as a whole below: walking the index would pass every running job
            # to find its few.
            listed = None if whole else {v.id for v in candidates}

            def allowed(victim: RunningJob) -> bool:
                if listed is not None and victim.id not in listed:
                    return False
                why = reasons[victim.id] = self._victim_reason(job, victim, borrowers, job_rank)
                return why is not None

            victims = cheapest_on_one_node(job, self.cap, self._victim_index(), allowed, self.now)
        else:
            for victim in candidates:
                why = self._victim_reason(job, victim, borrowers, job_rank)
                if why is not None:
                    reasons[victim.id] = why
            allowed_jobs = [r for r in self._preemptible if r.id in reasons] if reasons else []
            victims = (
                choose_victims(job, self.cap, allowed_jobs, self.now, cost=self._victim_cost)
                if allowed_jobs
                else None
            )
        if victims is None:
            self._preempt_fails.add(key)
            return False
        for victim in victims.jobs:
            self._preempted.add(victim.id)
            reason = f"preempted for job {job.id}: {reasons[victim.id]}"
            self.preempts.append(
                Preempt(victim.id, reason, requeue=victim.requeueable, for_job=job.id)
            )
        for member in victims.allocations:
            for index in member.gpu_indices:
                self.cap.hold(member.node, index)
        self.quota.take(job)
        self._waits[job.id] = (job, "preempting", victims)
        return True
