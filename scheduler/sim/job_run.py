"""One job's life in the simulator (its attempts, where it runs, what it used and lost),
and how a policy sees it: the PendingJob of a queued run, the RunningJob of a started one."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.core.model import Member, PendingJob, RunningJob
from scheduler.sim.jobs import JobSpec


@dataclass(slots=True, eq=False)
class JobRun:
    """One job's life in the simulator."""

    spec: JobSpec
    # future, pending, running, then done, timeout, killed, rejected or unschedulable
    state: str = "future"
    first_start: float | None = None
    finish: float | None = None
    attempt: int = 0
    started_at: float = 0.0
    node: str = ""
    gpu_indices: tuple[int, ...] = ()
    # Every member of the current attempt, rank 0 (node, gpu_indices) first.
    members: tuple[Member, ...] = ()
    slowdown: float = 1.0  # of the current attempt (gang spread)
    speed: float = 1.0  # of the current attempt (its GPU model; JobSpec.speeds)
    spread_gpu_seconds: float = 0.0  # GPU-seconds the slowdown cost, over all attempts
    overhead: float = 0.0  # restart overhead of the current attempt
    done_work: float = 0.0  # useful seconds kept from earlier attempts (checkpointing)
    attained: float = 0.0  # GPU-seconds run by earlier attempts
    preemptions: int = 0
    queued_at: float | None = None  # when a preemption last requeued it (None: never)
    lost_gpu_seconds: float = 0.0
    busy_gpu_seconds: float = 0.0
    predicted: float | None = None
    ends_at: float = math.inf

    @property
    def remaining_work(self) -> float:
        return self.spec.work - self.done_work


def pending_job(run: JobRun, declare_speeds: bool) -> PendingJob:
    """The queued run as a policy sees it (its next attempt pays the restart overhead)."""
    spec = run.spec
    return PendingJob(
        id=spec.id,
        team=spec.team,
        user=spec.user,
        submitted_at=spec.submit,
        time_limit=(spec.time_limit or spec.work) + run.overhead,
        gpus=spec.gpus,
        gpu_memory_mb=spec.gpu_memory_mb,
        gpu_compute_percent=spec.gpu_compute_percent,
        gpu_model=spec.gpu_model,
        priority=spec.priority,
        name=spec.name,
        predicted_runtime=None if run.predicted is None else run.predicted + run.overhead,
        attained_service=run.attained,
        gpus_per_node=spec.gpus_per_node,
        cpus=spec.cpus,
        memory_mb=spec.memory_mb,
        preemptions=run.preemptions,
        queued_at=run.queued_at,
        gpu_speeds=spec.speeds if declare_speeds else (),
    )


def running_job(run: JobRun, now: float, stretch: float, requeueable: bool) -> RunningJob:
    """The run just started at `now` as a policy sees it; `stretch` is the seconds its
    attempt takes per second of work (spread slowdown over GPU speed)."""
    spec = run.spec
    return RunningJob(
        id=spec.id,
        team=spec.team,
        user=spec.user,
        node=run.node,
        gpu_indices=run.gpu_indices,
        started_at=now,
        time_limit=(spec.time_limit or spec.work) * stretch + run.overhead,
        gpus=spec.gpus,
        gpu_memory_mb=spec.gpu_memory_mb,
        gpu_compute_percent=spec.gpu_compute_percent,
        priority=spec.priority,
        predicted_runtime=(
            None if run.predicted is None else run.predicted * stretch + run.overhead
        ),
        requeueable=requeueable,
        attained_service=run.attained,
        members=run.members[1:],
        gpus_per_node=spec.gpus_per_node,
        cpus=spec.cpus,
        memory_mb=spec.memory_mb,
        preemptions=run.preemptions,
        queued_at=spec.submit if run.queued_at is None else run.queued_at,
        checkpointed=spec.checkpointed,
    )
