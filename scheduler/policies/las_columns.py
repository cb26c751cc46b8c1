"""las' victim rule by columns (scheduler.policies.las): the running jobs the rule may allow
a waiting job, over all victims at once (Cycle's `victim_filter`), and the waiting jobs it
may allow any victim at all (Cycle's `rule_hint`).

Without them a waiting job that does not fit asks the rule about every running job, and a
queue of such jobs never lets the walk pass over the rest: on a full fleet of 4,000 running
jobs with 10,000 waiting, a burst cycle asked the rule 7.3 million times and found no
victim that paid (`bench/RESULTS.md`). The filter applies the rule's numeric tests with the
same float operations, so it lists exactly the victims whose queue is later than the job's
and, with the gain check, whose expected remaining service beats the job's by the
preemption's weighted cost; the rule still decides each listed victim (and writes its
reason). The hint is looser, never stricter: a job is passed over only where no victim of a
later queue could pay by more than rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from scheduler.core.model import PendingJob, RunningJob
from scheduler.core.preemption_cost import PreemptionCost

# Relative slack of the hint's comparison (a + b < c is tested as a <= c - b + slack).
_SLACK = 1e-9


class QueueColumns:
    """One cycle's victim columns for las' rule: each victim's queue and, with the gain
    check, its weighted preemption cost and expected remaining service (`victim_left`,
    the rule's own numbers, asked once per victim)."""

    def __init__(
        self,
        *,
        queue_of: Mapping[int, int],
        pending_queue: Callable[[PendingJob], int],
        expected_left: Callable[[float], float],
        victim_left: Callable[[RunningJob], float],
        costs: PreemptionCost,
        now: float,
        check_gain: bool,
        bounds: Sequence[float],
    ) -> None:
        self._queue_of = queue_of
        self._pending_queue = pending_queue
        self._expected_left = expected_left
        self._victim_left = victim_left
        self._costs = costs
        self._now = now
        self._check_gain = check_gain
        self._bounds = np.asarray(bounds, float)
        self._of: list[RunningJob] | None = None
        self._queue = np.zeros(0, np.int64)
        self._cost = np.zeros(0)
        self._other = np.zeros(0)
        self._known = np.zeros(0, bool)

    def _columns(self, victims: list[RunningJob]) -> None:
        if self._of is victims:
            return
        n = len(victims)
        queue_of = self._queue_of
        self._queue = np.fromiter((queue_of[v.id] for v in victims), np.int64, n)
        if self._check_gain:
            cost, _ = self._costs.columns(victims, self._now)
            # gain_pays' cost_weight x gpu_seconds: the same float operations.
            self._cost = self._costs.cost_weight * cost
            self._other = np.zeros(n)
            self._known = np.zeros(n, bool)
        self._of = victims

    def _others(self, rows: np.ndarray) -> np.ndarray:
        """The victims' expected remaining service at these rows, asked as first needed."""
        missing = rows[~self._known[rows]]
        if len(missing):
            assert self._of is not None
            victims, left = self._of, self._victim_left
            self._other[missing] = [left(victims[k]) for k in missing.tolist()]
            self._known[missing] = True
        return self._other[rows]

    def victim_filter(self, job: PendingJob, victims: list[RunningJob]) -> list[int]:
        """The positions in `victims` of those the rule's tests allow `job`, in order."""
        self._columns(victims)
        rows = np.flatnonzero(self._queue > self._pending_queue(job))
        if not self._check_gain or not len(rows):
            listed: list[int] = rows.tolist()
            return listed
        mine = self._expected_left(job.attained_service)
        pays = (mine + self._cost[rows]) < self._others(rows)
        kept: list[int] = rows[pays].tolist()
        return kept

    def rule_hint(self, jobs: Sequence[PendingJob], victims: list[RunningJob]) -> np.ndarray:
        """Per job of `jobs`, False only where the rule allows it none of `victims`."""
        self._columns(victims)
        n = len(jobs)
        attained = np.fromiter((j.attained_service for j in jobs), float, n)
        if not len(self._queue):
            return np.zeros(n, bool)
        bounds = self._bounds
        if np.isnan(attained).any() or (np.diff(bounds) < 0).any() or np.isnan(bounds).any():
            return np.ones(n, bool)
        # bisect_right(bounds, attained): the jobs' queues.
        queue = np.searchsorted(bounds, attained, side="right")
        top = int(self._queue.max())
        if not self._check_gain:
            return queue < top
        # Per queue q, the most any victim of a later queue may gain: max(other - cost).
        later = np.flatnonzero(self._queue > int(queue.min()))
        best = np.full(top + 1, -np.inf)
        if len(later):
            gain = self._others(later) - self._cost[later]
            if not np.isfinite(gain).all():
                return np.ones(n, bool)
            slack_base = np.abs(self._other[later]).max() + np.abs(self._cost[later]).max()
            # best[q] = the most gain of a victim of a queue after q: per queue, then a
            # running maximum from the last queue down.
            by_queue = np.full(top + 2, -np.inf)
            np.maximum.at(by_queue, self._queue[later], gain)
            best = np.maximum.accumulate(by_queue[::-1])[::-1][1:]
        else:
            slack_base = 0.0
        ok = np.zeros(n, bool)
        rows = np.flatnonzero((queue < top) & (best[np.minimum(queue, top)] > -np.inf))
        if not len(rows):
            return ok
        values, back = np.unique(attained[rows], return_inverse=True)
        left = np.array([self._expected_left(float(a)) for a in values.tolist()], float)
        need = left[back.reshape(-1)]
        if not np.isfinite(need).all():
            ok[rows] = True
            return ok
        slack = _SLACK * (slack_base + np.abs(need))
        ok[rows] = need <= best[queue[rows]] + slack
        return ok
