"""Reading jobs: what a user may see, without N+1 queries."""

from __future__ import annotations

import re
from typing import Any

from django.db.models import Prefetch, QuerySet

from fleet.errors import NotFound
from fleet.models import Job, JobEvent, JobMember, JobState
from fleet.services.access import can_see_command
from scheduler.cycle.queue_order import QueueWaits, queue_waits

HIDDEN = "[hidden]"
# A file path in a reason (an agent's start error names the working directory it could not
# enter, or a file the command tried to run): a slash not inside a word, up to a separator.
_PATH = re.compile(r"(?<![\w.~-])[~.]{0,2}/[^\s:;,'\"()]+")


def job_list(*, fetched_by: Any) -> QuerySet[Job]:
    """Every member of any team sees the whole queue (metadata only: serializers hide env).
    The members of every attempt come in one more query (`job_members` picks the current
    attempt's)."""
    return Job.objects.select_related("owner", "team", "node").prefetch_related(
        Prefetch("members", queryset=JobMember.objects.select_related("node"))
    )


def job_members(*, job: Job) -> list[JobMember]:
    """The current attempt's members, rank 0 first: one per node of a multi-node job, one
    for a single-node job (none for a job dispatched before members were recorded)."""
    return sorted((m for m in job.members.all() if m.attempt == job.attempt), key=lambda m: m.rank)


def job_get(*, job_id: int, fetched_by: Any) -> Job:
    job = job_list(fetched_by=fetched_by).filter(id=job_id).first()
    if job is None:
        raise NotFound(f"Job {job_id} does not exist.")
    return job


def job_events(*, job: Job) -> QuerySet[JobEvent]:
    return job.events.order_by("id")


def job_reason_shown(*, job: Job, reason: str, fetched_by: Any) -> str:
    """A reason written about `job` (its state_reason, one of its events' reasons) as
    `fetched_by` may see it.

    The job's team and staff see it whole. Everyone else sees what the README grants them
    (job metadata), so the reason loses the job's command, working directory and environment
    values, and any file path (start errors name the working directory, exec errors the
    program)."""
    if not reason or can_see_command(fetched_by, job):
        return reason
    return job_reason_public(job=job, reason=reason)


def job_reason_public(*, job: Job, reason: str) -> str:
    """The reason as anyone outside the job's team sees it; for views shared by everyone
    (the queue fragment is rendered once for all viewers)."""
    private = [job.command, job.workdir, *(job.env or {}).values()]
    for text in sorted({t for t in private if t and len(t) >= 3}, key=len, reverse=True):
        reason = reason.replace(text, HIDDEN)
    return _PATH.sub(HIDDEN, reason)


def job_state_reason(*, job: Job, fetched_by: Any, waits: QueueWaits | None = None) -> str:
    """Why the job is in its state, as `fetched_by` may see it: for a pending job the last
    cycle left waiting, the reason that cycle gave (from `waits`, the stored queue order,
    read when not given; scheduler.cycle.queue_order), else its row's `state_reason`."""
    reason = job.state_reason or ""
    if job.state == JobState.PENDING:
        waiting = (queue_waits() if waits is None else waits).reason(job.pk)
        if waiting is not None:
            reason = waiting
    return job_reason_shown(job=job, reason=reason, fetched_by=fetched_by)
