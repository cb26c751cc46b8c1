"""Reads for the queue page and API, and the submit form's what-if estimate.

The queue shows what the last cycle wrote (ETAs and reasons on the job rows, the order of the
waiting jobs in one row: scheduler.cycle.positions): a few queries, however long the queue. The estimate runs the policy on a
fresh snapshot with the would-be job added, and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from django.db.models import F, QuerySet

from fleet.models import Job, JobState
from fleet.models.jobs import ACTIVE_STATES
from fleet.services.jobs import JobRequest, job_validate
from scheduler.core.eta import what_if
from scheduler.cycle.admission import pending_job
from scheduler.cycle.queue_order import QueueWaits, in_queue_order, queue_waits
from scheduler.cycle.runner import make_policy
from scheduler.cycle.snapshot import build_snapshot
from scheduler.models import CycleRecord


def _scoped(queryset: QuerySet[Job], *, user: Any, mine: bool, team: str | None) -> QuerySet[Job]:
    if mine:
        queryset = queryset.filter(owner=user)
    if team:
        queryset = queryset.filter(team__slug=team)
    return queryset


def queue_pending(
    *,
    fetched_by: Any,
    mine: bool = False,
    team: str | None = None,
    limit: int | None = None,
    waits: QueueWaits | None = None,
) -> tuple[int, list[Job]]:
    """How many jobs are pending, and the first `limit` of them (all when None) in the
    policy's order as of the last cycle (`waits`, read when not given), newer ones last;
    each with `shown_position`, its queue position (None for a job that cycle did not see)."""
    queryset = _scoped(
        Job.objects.filter(state=JobState.PENDING), user=fetched_by, mine=mine, team=team
    )
    waits = queue_waits() if waits is None else waits
    ordered = in_queue_order(queryset.values_list("id", "submitted_at"), waits)
    count = len(ordered)
    if limit is not None:
        ordered = ordered[:limit]
    found = queryset.select_related("owner", "team").in_bulk([job_id for job_id, _ in ordered])
    jobs = []
    for job_id, position in ordered:
        job = found.get(job_id)
        if job is not None:  # gone between the two reads
            job.shown_position = position  # type: ignore[attr-defined]
            jobs.append(job)
    return count, jobs


def queue_running(*, fetched_by: Any, mine: bool = False, team: str | None = None) -> QuerySet[Job]:
    """Assigned and running jobs, oldest start first."""
    queryset = Job.objects.filter(state__in=ACTIVE_STATES).select_related("owner", "team", "node")
    return _scoped(queryset, user=fetched_by, mine=mine, team=team).order_by(
        F("started_at").asc(nulls_last=True), "assigned_at", "id"
    )


def last_cycle() -> CycleRecord | None:
    return CycleRecord.objects.order_by("-id").first()


@dataclass(frozen=True)
class Estimate:
    would_start_now: bool
    node: str | None
    estimated_start: datetime | None
    reason: str
    policy: str
    team: str


def job_estimate(*, user: Any, request: JobRequest) -> Estimate:
    """Where and when a job would start if submitted now. Validation errors are those of
    submit; nothing is written."""
    team, values = job_validate(user=user, request=request)
    snap = build_snapshot(save_usage=False)
    policy, _ = make_policy(snap)
    job = pending_job(values, team, user.get_username(), job_id=-1)
    job = replace(
        job,
        submitted_at=snap.core.now,
        predicted_runtime=snap.predict(user.pk, job.name, job.time_limit),
    )
    starts_now, node, eta, reason = what_if(snap.core, policy, job)
    return Estimate(
        would_start_now=starts_now,
        node=node,
        estimated_start=None if eta is None else datetime.fromtimestamp(eta, tz=UTC),
        reason=reason,
        policy=policy.name,
        team=team.slug,
    )
