"""The walk over the queue that the policies' shared cycle (scheduler.policies.base.Cycle)
makes: each job considered in order, until what is left of the queue can only wait."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from scheduler.core.model import PendingJob, RunningJob, Snapshot
from scheduler.core.placement import FreeCapacity
from scheduler.core.quota import QuotaLedger
from scheduler.policies.cycle_parts import GuaranteeTest, HeldReservation, QueueRest
from scheduler.policies.job_rows import RankedJobs

# Jobs found ahead that, considered, only waited, before the walk looks ahead again.
_STALE = 8
# Positions the walk first looks ahead over; each further look covers twice as many.
_WINDOW = 4096
_EMPTY = np.zeros(0, np.int64)
# Jobs that only wait, from this many in a row, are recorded as a run (`_room_runs`).
_RUN = 8

# What the sentence of a job waiting for room depends on: its request shape
# (FreeCapacity.shape) and its team.
ROOM_FIELDS = (
    "team",
    "gpus",
    "gpu_compute_percent",
    "gpu_memory_mb",
    "gpus_per_node",
    "cpus",
    "memory_mb",
    "gpu_model",
    "min_gpu_memory_mb",
    "same_group",
)
request_key = attrgetter(*ROOM_FIELDS)


class QueueWalk:
    """The walk's part of Cycle (which sets these attributes and defines `consider`)."""

    snapshot: Snapshot
    now: float
    cap: FreeCapacity
    quota: QuotaLedger
    fast: bool
    preempt: bool
    blocking: bool
    explain: bool
    full_plan: bool
    reserve_rule: bool | Callable[[PendingJob], bool]
    victim_rule: Any
    # Per job of a queue, whether victim_rule may allow it any of the preemptible running
    # jobs (more is fine, never fewer); None: the walk considers every job.
    rule_hint: Callable[[Sequence[PendingJob], list[RunningJob]], np.ndarray] | None
    _preemptible: list[RunningJob]
    order: list[int]
    # The jobs of `order`, as walked (runs recorded at once are kept only where the plan
    # explains); one without an entry in _waits (nor placed) waits for room.
    _walked: list[PendingJob]
    # Runs of `order` that only wait, recorded at once, none placed: (start, end, whether
    # some job's quota holds it). A job of a run without an entry in _waits waits for room.
    _room_runs: list[tuple[int, int, bool]]
    _seen: set[int]
    _unmarked: list[Sequence[PendingJob]]
    _waits: dict[int, tuple[PendingJob, str, Any]]
    _reservation: HeldReservation | None
    _blocked_by: int | None
    _reclaim_on: bool
    _qos_on: bool
    _max_preempts: int
    places: list[Any]
    preempts: list[Any]

    def consider(self, job: PendingJob) -> bool:
        raise NotImplementedError

    def consider_all(self, jobs: Sequence[PendingJob], rest: QueueRest | None = None) -> None:
        """`consider` each job in order. Once no more reservation can be made, a job that
        cannot start now and cannot preempt only waits; so the walk goes from one job that
        might start (it needs no more than the largest free block, or is a fraction while
        some GPU is partly free, or may use the reservation before it starts) or might
        reclaim GPUs (its team stays within its guarantee with it) to the next, and the
        jobs between them are recorded at once, with the same waits `consider` would give
        them. Free capacity only shrinks and quota use only grows during a walk, so a job
        passed over could not have started or reclaimed later in it either; for the same
        reason the jobs found ahead at one point are a superset of those found later, and
        are looked for again only once some of them turned out to only wait. `rest`: the
        queue's needs (`QueueRest`) where the caller has them as columns already."""
        if not isinstance(jobs, list | RankedJobs):
            jobs = list(jobs)  # (a list or the rows' order is read as it is: read only)
        may_settle = self._may_settle() if self.fast else False
        if may_settle is False:
            for job in jobs:
                self.consider(job)
            return
        reclaim: GuaranteeTest | None = None
        ruled: np.ndarray | None = None  # per position: the policy's rule may allow a victim
        # Positions still to consider (numpy, so that a long queue does not become a
        # list of Python ints for the garbage collector to walk), from `at` on.
        ahead: np.ndarray | None = None
        at = 0
        upto = 0  # `ahead` holds the positions found up to here (not inclusive)
        width = _WINDOW
        wasted = 0  # jobs of `ahead` considered that only waited
        i, n = 0, len(jobs)
        while i < n:
            decided = len(self.places) + len(self.preempts)
            self.consider(jobs[i])
            i += 1
            if i == n or not self._settled_now():
                continue
            if self._blocked_by is not None:
                self._wait_rest(jobs[i:])
                return
            if rest is None:
                rest = QueueRest.of(jobs)
            elif rest.jobs is None:
                rest.jobs = jobs
            if may_settle is None:
                may_settle = True
                # Reclaiming needs a team within its guarantee: with none guaranteed, a job
                # that asks for some GPU share keeps no team within zero.
                if self._reclaim_on and (not rest.all_share or self._guarantees()):
                    reclaim = rest.guarantee_test(self.snapshot.teams)
                if self.victim_rule is not None and self.rule_hint is not None:
                    ruled = self.rule_hint(jobs, self._preemptible)
            if ahead is not None and len(self.places) + len(self.preempts) == decided:
                wasted += 1
            if ahead is None or wasted >= _STALE:
                upto, width, wasted = i, _WINDOW, 0
                ahead, at = _EMPTY, 0
            while True:
                while at < len(ahead) and ahead[at] < i:
                    at += 1
                if at < len(ahead) or upto >= n:
                    break
                # Nothing found ahead up to `upto`: look further, in a window twice as
                # wide, so that a walk that stops soon never scans the whole queue.
                end = min(n, upto + width)
                ahead, at = self._ahead(rest, upto, end, reclaim, ruled), 0
                upto, width = end, 2 * width
            k = int(ahead[at]) if at < len(ahead) else n
            at += 1
            if k == n:
                self._wait_rest(jobs[i:])
                return
            if k > i:
                self._wait_segment(jobs[i:k])
                i = k

    def _may_settle(self) -> bool | None:
        """Whether no preemption rule can apply to any job of this walk (True), some may
        apply to any job (False), or only reclaiming, by jobs that keep their team within
        its guarantee, and the policy's rule, for jobs its `rule_hint` marks, may (None)."""
        if not self.preempt or self._blocked_by is not None:
            return True
        if self._qos_on:
            return False
        if self.victim_rule is not None:
            return None if self.rule_hint is not None else False
        return None if self._reclaim_on else True

    def _guarantees(self) -> bool:
        return any(t.guaranteed_gpus > 0 for t in self.snapshot.teams.values())

    def _settled_now(self) -> bool:
        """Cheap part of the test: blocked, or a reservation made (or none wanted)."""
        if self._blocked_by is not None:
            return True
        return self._reservation is not None or not (
            callable(self.reserve_rule) or self.reserve_rule
        )

    def _ahead(
        self,
        rest: QueueRest,
        i: int,
        end: int,
        reclaim: GuaranteeTest | None,
        ruled: np.ndarray | None,
    ) -> np.ndarray:
        """The positions from i up to `end` whose job might start now, reclaim GPUs or
        preempt by the policy's rule (given `_settled_now`)."""
        largest, _ = self.cap.largest_free_block()
        held = self._reservation
        short = None
        if held is not None and not held.empty():
            # A later job may still use the reservation's node if it ends before the
            # reservation starts and fits there with the held GPUs given back: at most the
            # node's whole free GPUs plus the held GPUs that were wholly free.
            room = max(len(self.cap.whole_free(n)) + held.whole_held(n) for n in held.nodes)
            short = (self.now, held.start, room)
        mask = rest.may_start(
            i, end, largest, self.cap.partial_compute(), short, self.cap.no_room_shapes()
        )
        if len(self.preempts) < self._max_preempts:
            if reclaim is not None:
                mask |= reclaim.within(i, end, self.quota.team_usage)
            if ruled is not None:
                mask |= ruled[i:end]
        return np.flatnonzero(mask) + i

    def _wait_segment(self, jobs: Sequence[PendingJob]) -> None:
        """Record jobs that only wait, ahead of others still to be considered."""
        if (not self.full_plan or not self.explain) and (
            self._blocked_by is not None or not self.blocking
        ):
            if self._order_at_once(jobs):
                return
        self._wait_each(jobs)

    def _wait_rest(self, jobs: Sequence[PendingJob]) -> None:
        if not self.full_plan and (self._blocked_by is not None or not self.blocking):
            # Nothing of the rest is decided; without Waits it is only marked seen, and
            # only if the policy considers more jobs afterwards.
            self._unmarked.append(jobs)
            return
        if not self.explain and (self._blocked_by is not None or not self.blocking):
            if self._order_at_once(jobs):
                return
        self._wait_each(jobs)

    def _order_at_once(self, jobs: Sequence[PendingJob]) -> bool:
        """Mark the jobs seen and append them to the order in one step, when none of them
        was seen and no id repeats (else False, and nothing is marked). The jobs walked are
        kept only for the sentences of a full plan (from the rows' order, the ids are read
        without the jobs otherwise)."""
        explained = self.full_plan and self.explain
        ids = (
            jobs.job_ids()
            if isinstance(jobs, RankedJobs) and not explained
            else [j.id for j in jobs]
        )
        seen = self._seen
        if seen.isdisjoint(ids) and len(set(ids)) == len(ids):
            seen.update(ids)
            self.order.extend(ids)
            if explained:
                self._walked.extend(jobs)
            return True
        return False

    def _wait_each(self, jobs: Sequence[PendingJob]) -> None:
        start = len(self.order)
        if (
            len(jobs) < _RUN
            or self.blocking
            or self._blocked_by is not None
            or not self._order_at_once(jobs)
        ):
            self._wait_one_by_one(jobs)
            return
        # Each waits for room (no entry) unless its quota holds it.
        limits = list(map(self.quota.check, jobs))
        by_quota = limits.count(None) < len(limits)
        if by_quota:
            for job, limit in zip(jobs, limits, strict=True):
                if limit is not None:
                    self._waits[job.id] = (job, "quota", limit)
        self._room_runs.append((start, len(self.order), by_quota))

    def _wait_one_by_one(self, jobs: Sequence[PendingJob]) -> None:
        seen = self._seen
        check = self.quota.check
        for job in jobs:
            if job.id in seen:
                continue
            seen.add(job.id)
            self.order.append(job.id)
            self._walked.append(job)
            if self._blocked_by is not None:
                self._waits[job.id] = (job, "blocked", self._blocked_by)
                continue
            limit = check(job)
            if limit is not None:
                self._waits[job.id] = (job, "quota", limit)
                continue
            if self.blocking:
                self._blocked_by = job.id

    def _mark_seen(self) -> None:
        for jobs in self._unmarked:
            self._seen.update(j.id for j in jobs)
        self._unmarked.clear()
