"""Least attained service, preemptive (Tiresias-style discretized LAS)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.model import PendingJob, Plan, RunningJob, Snapshot
from scheduler.core.preemption_cost import PreemptionCost, mean_residual
from scheduler.policies.base import Cycle, VictimRule, cycle_may_preempt
from scheduler.policies.cycle_preempt import Reason, RuleHint, VictimFilter
from scheduler.policies.las_columns import QueueColumns
from scheduler.policies.preemptive import PreemptivePolicy

# GPU-seconds of attained service at which a job drops to the next queue: 1, 10, 100 GPU-hours.
DEFAULT_THRESHOLDS = (3600.0, 36000.0, 360000.0)


@dataclass(frozen=True, slots=True)
class QueueVictims:
    """las' victim rule, its rule_key, and its tests by columns where the fast paths are on."""

    rule: VictimRule
    key: Callable[[PendingJob], Any]
    columns: QueueColumns | None

    def filter(self) -> VictimFilter | None:
        return None if self.columns is None else self.columns.victim_filter

    def hint(self) -> RuleHint | None:
        return None if self.columns is None else self.columns.rule_hint


class LasPolicy(PreemptivePolicy):
    """Jobs that have had the least GPU time (GPU-seconds over all attempts) go first, in
    discretized queues (settings "las_queue_thresholds", default 1, 10 and 100 GPU-hours)
    and in submit order within a queue. A pending job that does not fit may preempt
    preemptible running jobs sitting in a later queue (settings "las_preemption", default
    on), which are requeued, when the preemption pays for itself (settings
    "preemption_gain_check", default on): the waiting job's expected remaining service plus
    the preemption's cost (restart, lost progress: `PreemptionCost`) is below the victim's,
    both learned from finished jobs' sizes (`Snapshot.service_distribution`; without them a
    job is expected to need as much again as it has attained). A job preempted
    "preemption_max_per_job" times (default 10) is not preempted again.

    Trade-off: needs no runtime estimates and favours short jobs, since every job starts
    in the first queue and long ones sink; but it preempts (requeue and checkpoint costs),
    and a steady stream of new jobs can hold back long ones, whose attained service never
    goes down.
    """

    name = "las"

    def may_preempt(self, settings: Mapping[str, Any], guarantees: bool) -> bool:
        if settings.get("las_preemption", True) or settings.get("qos_preemption", False):
            return True
        return cycle_may_preempt(settings, guarantees)

    def __init__(self, thresholds: Sequence[float] | None = None, **params: object) -> None:
        super().__init__(**params)
        self.thresholds = tuple(thresholds) if thresholds is not None else None

    def _thresholds(self, snapshot: Snapshot) -> tuple[float, ...]:
        if self.thresholds is not None:
            return self.thresholds
        return tuple(snapshot.settings.get("las_queue_thresholds") or DEFAULT_THRESHOLDS)

    def order(self, snapshot: Snapshot) -> list[PendingJob]:
        bounds = self._thresholds(snapshot)
        return sorted(
            snapshot.pending,
            key=lambda j: (bisect_right(bounds, j.attained_service), j.submitted_at, j.id),
        )

    def queue_victims(self, snapshot: Snapshot) -> QueueVictims:
        """The rule for preempting by queue; what decides which victims it allows for a
        waiting job (Cycle's rule_key): its queue, and its attained service where the gain
        is checked; and the rule's tests by columns (`QueueColumns`: Cycle's victim_filter
        and rule_hint; None with settings "fast_paths" false, so the rule alone answers)."""
        bounds = self._thresholds(snapshot)
        now = snapshot.now

        def running_queue(job: RunningJob) -> int:
            attained = job.attained_service + max(now - job.started_at, 0.0) * job.gpu_equivalent
            return bisect_right(bounds, attained)

        queue_of = {r.id: running_queue(r) for r in snapshot.running}

        def pending_queue(job: PendingJob) -> int:
            return bisect_right(bounds, job.attained_service)

        costs = PreemptionCost.from_settings(snapshot.settings)
        check_gain = bool(snapshot.settings.get("preemption_gain_check", True))
        atoms = tuple(sorted(snapshot.service_distribution))
        victim_left: dict[int, float] = {}
        # Expected GPU-seconds to come by attained service (a search asks about one waiting
        # job against hundreds of victims).
        left_after: dict[float, float] = {}

        def expected_left(attained: float) -> float:
            left = left_after.get(attained)
            if left is None:
                left = left_after[attained] = mean_residual(atoms, attained)
            return left

        def victim_rule(job: PendingJob, victim: RunningJob) -> Reason | None:
            if queue_of[victim.id] <= pending_queue(job):
                return None
            mine = theirs = 0.0
            if check_gain:
                mine, theirs = expected_left(job.attained_service), victim_known(victim)
                if not costs.gain_pays(mine, theirs, victim, now):
                    return None

            def write() -> str:
                why = (
                    f"least attained service: it is in queue {queue_of[victim.id] + 1}, "
                    f"job {job.id} in queue {pending_queue(job) + 1}"
                )
                return f"{why}; {costs.pays(mine, theirs, victim, now)}" if check_gain else why

            return Reason(write)

        def victim_known(victim: RunningJob) -> float:
            known = victim_left.get(victim.id)
            if known is None:
                ran = max(now - victim.started_at, 0.0) * victim.gpu_equivalent
                known = victim_left[victim.id] = mean_residual(atoms, victim.attained_service + ran)
            return known

        columns = None
        if snapshot.settings.get("fast_paths", True):
            columns = QueueColumns(
                queue_of=queue_of,
                pending_queue=pending_queue,
                expected_left=expected_left,
                victim_left=victim_known,
                costs=costs,
                now=now,
                check_gain=check_gain,
                bounds=bounds,
            )
        # The gain check reads the job's attained service, not only its queue.
        rule_key: Callable[[PendingJob], Any] = pending_queue
        if check_gain:
            rule_key = lambda j: (pending_queue(j), j.attained_service)  # noqa: E731
        return QueueVictims(victim_rule, rule_key, columns)

    def schedule(self, snapshot: Snapshot) -> Plan:
        victims = self.queue_victims(snapshot)
        preempt = bool(snapshot.settings.get("las_preemption", True))
        cycle = Cycle(
            snapshot,
            self.name,
            preempt=True,
            victim_rule=victims.rule if preempt else None,
            rule_key=victims.key,
            victim_filter=victims.filter(),
            rule_hint=victims.hint(),
        )
        cycle.consider_all(self.order(snapshot))
        return cycle.plan()
