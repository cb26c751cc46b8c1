"""Tiresias: discretized two-dimensional least attained service (2D-LAS), as published.

Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning", NSDI'19. The
baseline that bench/ compares fleet's own policies against; fleet's `las` and `gittins` are
its relatives with their own refinements (more queues, learned sizes, paid preemption).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from scheduler.core.model import PendingJob, Plan, RunningJob, Snapshot
from scheduler.policies.base import Cycle
from scheduler.policies.preemptive import PreemptivePolicy

# Defaults, with the parameters used by the published configuration (see the class).
DEFAULT_THRESHOLD_GPU_HOURS = 16.0
DEFAULT_STARVE = 10.0
DEFAULT_MAX_PREEMPTIONS = 0  # as published: no cap

HIGH, LOW = 0, 1


class TiresiasPolicy(PreemptivePolicy):
    """Two queues by attained service in GPU-seconds (GPUs x time run, over all attempts:
    the "2D" of 2D-LAS). Every job enters the high queue and drops to the low one once it
    has attained the threshold (settings "tiresias_threshold", GPU-hours, default 16: the
    two-queue configuration with one 16 GPU-hour threshold used by the Tiresias baselines
    of later work, e.g. Pollux, OSDI'21). Within a queue jobs go first come, first served
    (by the time they entered the queue); between queues it is preemptive: a waiting job of
    the high queue that does not fit preempts running jobs of the low queue (settings
    "tiresias_preemption", default on), which are requeued. Jobs of one queue never preempt
    each other.

    Starvation guard, as in the paper: a waiting job of the low queue that has waited longer
    than STARVE times the time it has executed is promoted back to the high queue, and its
    executed time counts from zero again, so it keeps the high queue until it attains the
    threshold once more (settings "tiresias_starve", default 10; 0 turns the guard off,
    which is the default of the authors' simulator, where the knob is `solve_starvation`).
    The paper leaves the knob to the operator; 10 is fleet's choice.

    What fleet knows without keeping state between cycles makes two approximations: the
    time executed is the job's whole run time over earlier attempts (the paper counts it
    since the last promotion), and a job counts as promoted in its current attempt when it
    started after waiting at least STARVE times that (`RunningJob.queued_at`; where the
    snapshot does not say when it was queued, a promoted job is judged by its attained
    service again once it runs).

    Preemption is what the paper does: no gain check, and no per-job cap (settings
    "tiresias_max_preemptions", default 0: none; it replaces "preemption_max_per_job" for
    this policy). Restart costs are paid as they come; `las` and `gittins` are fleet's
    policies that preempt only when it pays.

    Trade-off: needs no runtime estimates, only two queues to reason about; but one coarse
    threshold cannot tell a 1 GPU-hour job from a 15 GPU-hour one, and preemption between
    queues ignores what it costs.
    """

    name = "tiresias"

    def __init__(
        self,
        threshold: float | None = None,
        starve: float | None = None,
        **params: Any,
    ) -> None:
        super().__init__(**params)
        self.threshold, self.starve = threshold, starve

    def schedule(self, snapshot: Snapshot) -> Plan:
        now = snapshot.now
        hours = float(
            self.setting(
                snapshot, self.threshold, "tiresias_threshold", DEFAULT_THRESHOLD_GPU_HOURS
            )
        )
        bound = hours * 3600.0
        starve = float(self.setting(snapshot, self.starve, "tiresias_starve", DEFAULT_STARVE))

        def executed(attained: float, gpus: float) -> float:
            """Seconds run over earlier attempts."""
            return attained / gpus if gpus > 0 else 0.0

        def promoted_at(job: PendingJob) -> float | None:
            """When the job is (or was) promoted back to the high queue, or None."""
            if starve <= 0 or job.attained_service < bound:
                return None
            ran = executed(job.attained_service, job.gpu_equivalent)
            if job.queued_at is not None:
                since = job.queued_at
            else:
                # Unknown: what it waited since submit, less what it ran.
                since = job.submitted_at + ran
            at = since + starve * ran
            return at if now >= at else None

        entry: dict[int, tuple[int, float]] = {}  # job id -> (queue, entered it at)
        for job in snapshot.pending:
            if job.attained_service < bound:
                entry[job.id] = (HIGH, job.submitted_at)
                continue
            at = promoted_at(job)
            entry[job.id] = (HIGH, at) if at is not None else (LOW, job.submitted_at)

        def running_queue(r: RunningJob) -> int:
            ran = max(now - r.started_at, 0.0) * r.gpu_equivalent
            if r.attained_service + ran < bound:
                return HIGH
            if starve > 0 and r.attained_service >= bound and r.queued_at is not None:
                before = executed(r.attained_service, r.gpu_equivalent)
                if r.started_at - r.queued_at >= starve * before and ran < bound:
                    return HIGH  # promoted for this attempt, not yet demoted again
            return LOW

        queue_of = {r.id: running_queue(r) for r in snapshot.running}

        def victim_rule(job: PendingJob, victim: RunningJob) -> str | None:
            mine, theirs = entry[job.id][0], queue_of[victim.id]
            if theirs > mine:
                return (
                    f"Tiresias: it has attained {hours:g} GPU-hours (low queue), "
                    f"job {job.id} is in the high queue"
                )
            return None

        # The rule by columns (settings "fast_paths"): a job may preempt only victims of a
        # later queue, so a low-queue job is never searched for and the walk passes over it.
        columns: dict[str, Any] = {}

        def victim_queues(victims: list[RunningJob]) -> np.ndarray:
            if columns.get("of") is not victims:
                queues = np.fromiter((queue_of[v.id] for v in victims), np.int64, len(victims))
                columns.update(of=victims, queues=queues, later={})
            found: np.ndarray = columns["queues"]
            return found

        def victim_filter(job: PendingJob, victims: list[RunningJob]) -> list[int]:
            queues, mine = victim_queues(victims), entry[job.id][0]
            later: dict[int, list[int]] = columns["later"]
            if mine not in later:
                later[mine] = np.flatnonzero(queues > mine).tolist()
            return later[mine]

        def rule_hint(jobs: Sequence[PendingJob], victims: list[RunningJob]) -> np.ndarray:
            queues = victim_queues(victims)
            mine = np.fromiter((entry[j.id][0] for j in jobs), np.int64, len(jobs))
            return mine < (queues.max() if len(queues) else -1)

        settings = snapshot.settings
        fast = bool(settings.get("fast_paths", True))
        cap = settings.get("tiresias_max_preemptions")
        cap = DEFAULT_MAX_PREEMPTIONS if cap is None else int(cap)
        if settings.get("preemption_max_per_job") != cap:
            snapshot = replace(snapshot, settings={**settings, "preemption_max_per_job": cap})
        preempt = bool(settings.get("tiresias_preemption", True))
        cycle = Cycle(
            snapshot,
            self.name,
            preempt=True,
            victim_rule=victim_rule if preempt else None,
            rule_key=lambda j: entry[j.id][0],
            victim_filter=victim_filter if fast else None,
            rule_hint=rule_hint if fast else None,
        )
        cycle.consider_all(
            sorted(snapshot.pending, key=lambda j: (*entry[j.id], j.submitted_at, j.id))
        )
        promoted = sum(
            1 for j in snapshot.pending if entry[j.id][0] == HIGH and j.attained_service >= bound
        )
        notes = (
            (f"tiresias: {promoted} waiting jobs promoted against starvation",) if promoted else ()
        )
        return cycle.plan(notes)
