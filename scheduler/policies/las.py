"""Least attained service, preemptive (Tiresias-style discretized LAS)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.core.model import PendingJob, Plan, RunningJob, Snapshot
from scheduler.policies.base import Cycle, cycle_may_preempt

# GPU-seconds of attained service at which a job drops to the next queue: 1, 10, 100 GPU-hours.
DEFAULT_THRESHOLDS = (3600.0, 36000.0, 360000.0)


class LasPolicy:
    """Jobs that have had the least GPU time (GPU-seconds over all attempts) go first, in
    discretized queues (settings "las_queue_thresholds", default 1, 10 and 100 GPU-hours)
    and in submit order within a queue. A pending job that does not fit may preempt
    preemptible running jobs sitting in a later queue (settings "las_preemption", default
    on), which are requeued.

    Trade-off: needs no runtime estimates and favours short jobs, since every job starts
    in the first queue and long ones sink; but it preempts (requeue and checkpoint costs),
    and a steady stream of new jobs can hold back long ones, whose attained service never
    goes down.
    """

    name = "las"
    blocking = False
    # For drivers that skip cycles (the simulator): running jobs' attained service grows
    # with the clock, which moves them between queues.
    time_dependent = True

    def may_preempt(self, settings: Mapping[str, Any], guarantees: bool) -> bool:
        if settings.get("las_preemption", True) or settings.get("qos_preemption", False):
            return True
        return cycle_may_preempt(settings, guarantees)

    def __init__(self, thresholds: Sequence[float] | None = None, **params: object) -> None:
        self.thresholds = tuple(thresholds) if thresholds is not None else None
        self.params = params

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

    def schedule(self, snapshot: Snapshot) -> Plan:
        bounds = self._thresholds(snapshot)
        now = snapshot.now

        def running_queue(job: RunningJob) -> int:
            attained = job.attained_service + max(now - job.started_at, 0.0) * job.gpu_equivalent
            return bisect_right(bounds, attained)

        queue_of = {r.id: running_queue(r) for r in snapshot.running}

        def pending_queue(job: PendingJob) -> int:
            return bisect_right(bounds, job.attained_service)

        def victim_rule(job: PendingJob, victim: RunningJob) -> str | None:
            if queue_of[victim.id] > pending_queue(job):
                return (
                    f"least attained service: it is in queue {queue_of[victim.id] + 1}, "
                    f"job {job.id} in queue {pending_queue(job) + 1}"
                )
            return None

        preempt = bool(snapshot.settings.get("las_preemption", True))
        cycle = Cycle(
            snapshot,
            self.name,
            preempt=True,
            victim_rule=victim_rule if preempt else None,
            rule_key=pending_queue,
        )
        cycle.consider_all(self.order(snapshot))
        return cycle.plan()
