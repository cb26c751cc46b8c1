"""What a single submit answers: the new job as JobOutputSerializer shows it, built as a
plain dict (a ModelSerializer builds its forty fields anew for every response, which cost
more than the rest of a submit's answer).

Only a job that has not started is built here; anything else goes through the serializer.
tests/fleet/test_submit_lean.py holds the two to the same output."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleet.models import Job
from fleet.models.jobs import QUEUED_STATES, JobState
from fleet.selectors.jobs import job_state_reason
from fleet.services.access import can_manage_job, can_see_command
from scheduler.cycle.queue_order import NO_WAITS

_DATETIME = serializers.DateTimeField()


def _when(value: Any) -> str | None:
    return _DATETIME.to_representation(value) if value is not None else None


def job_submitted(job: Job, user: Any) -> dict[str, Any] | None:
    """The job as `JobOutputSerializer(job)` shows it to `user`, for a job that has not
    started (queued, attempt 0, no ETA yet); None for any other job."""
    if job.state not in QUEUED_STATES or job.attempt or job.eta is not None:
        return None
    pending = job.state == JobState.PENDING
    # Just submitted: no cycle has seen it yet, so no stored wait to read.
    state_reason = job_state_reason(job=job, fetched_by=user, waits=NO_WAITS)
    sees_command = can_see_command(user, job)
    manages = can_manage_job(user, job)
    return {
        "id": job.pk,
        "name": job.name,
        "owner": job.owner.username,
        "team": job.team.slug,
        "state": str(job.state),
        "state_reason": state_reason,
        "pending_reason": (
            (state_reason or "waiting for the scheduler's next cycle") if pending else None
        ),
        "attempt": job.attempt,
        "requeues": job.requeues,
        "gpus": job.gpus,
        "gpu_memory_mb": job.gpu_memory_mb,
        "gpu_compute_percent": job.gpu_compute_percent,
        "gpu_model": job.gpu_model,
        "min_gpu_memory_mb": job.min_gpu_memory_mb,
        "time_limit": job.time_limit,
        "priority": job.priority,
        "qos": str(job.qos),
        "preemptible": job.preemptible,
        "max_requeues": job.max_requeues,
        "node": job.node.name if job.node is not None else None,
        "gpu_indices": job.gpu_indices,
        "exit_code": job.exit_code,
        "submitted_at": _when(job.submitted_at),
        "assigned_at": _when(job.assigned_at),
        "started_at": _when(job.started_at),
        "finished_at": _when(job.finished_at),
        "queue_position": job.queue_position if pending else None,
        "eta": None,
        "eta_band": None,
        "command": job.command if sees_command else None,
        "env": job.env if manages else None,
        "workdir": job.workdir if sees_command else None,
        "can_manage": manages,
        "gpus_per_node": job.gpus_per_node,
        "nodes": job.nodes,
        "cpus": job.cpus,
        "memory_mb": job.memory_mb,
        "same_group": job.same_group,
        "members": [],
        "resumed": None,
        "array_id": job.array_id,
        "array_index": job.array_index,
    }
