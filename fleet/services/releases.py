"""GPUs held by stopping attempts (see fleet.models.GpuRelease).

A hold is made when a job leaves assigned/running while its process may still live, and
dropped when the agent reports that attempt's end, when a heartbeat no longer lists it, or
when it expires (the job's grace period plus a margin), so a lost message never keeps a
GPU busy for long.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from fleet.models import GpuRelease, Job, Node, NodeState

# Time for the agent's report of the end to arrive after SIGKILL.
REPORT_MARGIN_S = 15.0


def hold_expiry(now: datetime, *, longer_s: float = 0.0) -> datetime:
    """When a hold made now expires: the job's grace period, the time for the report of
    the end to arrive, and `longer_s` more."""
    return now + timedelta(seconds=float(settings.FLEET_JOB_GRACE) + REPORT_MARGIN_S + longer_s)


def gpu_release_hold(*, job: Job, now: datetime | None = None) -> GpuRelease | None:
    """Keep the GPUs of the attempt that `job` just left busy until that attempt ends (its
    rank 0 member; fleet.services.members holds every member of a multi-node attempt)."""
    if not job.previous_node_id or not job.previous_gpu_indices:
        return None
    return gpu_release_hold_member(
        job=job,
        attempt=job.previous_attempt,
        node_id=job.previous_node_id,
        gpu_indices=job.previous_gpu_indices,
        now=now,
    )


def gpu_release_hold_member(
    *,
    job: Job,
    attempt: int,
    node_id: int,
    gpu_indices: Iterable[int],
    now: datetime | None = None,
) -> GpuRelease | None:
    """Keep one member's GPUs, CPU cores and host memory on its node busy until that
    member's process has ended."""
    node_state = Node.objects.filter(id=node_id).values_list("state", flat=True)
    if not node_state or node_state[0] == NodeState.DOWN:
        return None  # a down node schedules nothing; its agent reconciles when it returns
    expires = hold_expiry(now or timezone.now())
    try:
        with transaction.atomic():
            return GpuRelease.objects.create(
                node_id=node_id,
                job=job,
                attempt=attempt,
                gpu_indices=[int(i) for i in gpu_indices],
                gpus=job.gpus,
                gpu_memory_mb=job.gpu_memory_mb,
                gpu_compute_percent=job.gpu_compute_percent,
                cpus=job.cpus,
                memory_mb=job.memory_mb,
                expires_at=expires,
            )
    except IntegrityError:
        return None  # this member is already being released


def gpu_release_hold_running(
    *,
    node: Node,
    job_id: int,
    attempt: int,
    gpu_indices: Iterable[int],
    now: datetime | None = None,
) -> None:
    """The node still runs an attempt the control side no longer assigns to it (a node back
    from down, a stop not yet carried out): keep its GPUs busy until a heartbeat no longer
    lists it. Each heartbeat that lists it again extends the hold."""
    job = (
        Job.objects.filter(pk=job_id)
        .only("gpus", "gpu_memory_mb", "gpu_compute_percent", "cpus", "memory_mb")
        .first()
    )
    if job is None:
        return
    expires = hold_expiry(now or timezone.now(), longer_s=node.heartbeat_timeout)
    indices = [int(i) for i in gpu_indices]
    if GpuRelease.objects.filter(job_id=job_id, attempt=attempt, node=node).update(
        expires_at=expires
    ):
        return
    try:
        with transaction.atomic():
            GpuRelease.objects.create(
                node=node,
                job=job,
                attempt=attempt,
                gpu_indices=indices,
                gpus=job.gpus,
                gpu_memory_mb=job.gpu_memory_mb,
                gpu_compute_percent=job.gpu_compute_percent,
                cpus=job.cpus,
                memory_mb=job.memory_mb,
                expires_at=expires,
            )
    except IntegrityError:
        pass  # made meanwhile by another heartbeat


def gpu_release_done(*, job_id: int, attempt: int, node_id: int | None = None) -> int:
    """The agent of `node_id` reported that its member of the attempt ended: what it held
    there is free (None: on every node)."""
    held = GpuRelease.objects.filter(job_id=job_id, attempt=attempt)
    if node_id is not None:
        held = held.filter(node_id=node_id)
    return held.delete()[0]


def gpu_release_reconcile(*, node: Node, running: Iterable[tuple[int, int]]) -> int:
    """A heartbeat lists what the node still runs: holds for anything else are over."""
    listed = set(running)
    over = [
        r.pk
        for r in GpuRelease.objects.filter(node=node).only("id", "job_id", "attempt")
        if (r.job_id, r.attempt) not in listed
    ]
    return GpuRelease.objects.filter(id__in=over).delete()[0] if over else 0


def gpu_release_prune(*, now: datetime | None = None) -> int:
    return GpuRelease.objects.filter(expires_at__lte=now or timezone.now()).delete()[0]
