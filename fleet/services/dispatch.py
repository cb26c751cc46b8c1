"""What the control side sends an agent to start a job: one short message per attempt."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from fleet.models import Job
from fleet.services import messaging
from fleet.services.reaper import start_timeout_s
from workers.fence import dispatch_token


def start_spec(job: Job) -> dict[str, Any]:
    """The JSON spec an agent needs to run this attempt (workers.executor.JobSpec fields)."""
    return {
        "name": job.name,
        "command": job.command,
        "env": dict(job.env or {}),
        "workdir": job.workdir or None,
        "gpu_indices": list(job.gpu_indices or []),
        "time_limit": job.time_limit,
        "gpu_memory_mb": job.gpu_memory_mb,
        "gpu_compute_percent": job.gpu_compute_percent,
        # The control side keeps stopped jobs' GPUs reserved for this long (releases.py).
        "grace": settings.FLEET_JOB_GRACE,
        # Tells a redelivered start (same dispatch) from a new one that reuses the job id
        # and attempt (a control side whose database was reset).
        "dispatch": dispatch_token(job.assigned_at.timestamp()) if job.assigned_at else None,
        # The agent maps these to the local account the job runs as (FLEET_JOB_USER_MAP).
        "user": job.owner.username,
        "team": job.team.slug,
    }


def send_start_on_commit(job: Job) -> None:
    """After the dispatch transition commits, ask the job's node to start this attempt."""
    assert job.node is not None, "dispatch sets the node before the start message is sent"
    messaging.send_to_node_on_commit(
        job.node.name,
        messaging.START_JOB_TASK,
        # A start is good only while the control side waits for it: past the start timeout
        # the reaper takes it back, and it may be dispatched elsewhere.
        ttl=start_timeout_s(),
        job_id=job.pk,
        attempt=job.attempt,
        spec=start_spec(job),
    )
