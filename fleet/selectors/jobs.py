"""Reading jobs: what a user may see, without N+1 queries."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from fleet.errors import NotFound
from fleet.models import Job, JobEvent


def job_list(*, fetched_by: Any) -> QuerySet[Job]:
    """Every member of any team sees the whole queue (metadata only: serializers hide env)."""
    return Job.objects.select_related("owner", "team", "node")


def job_get(*, job_id: int, fetched_by: Any) -> Job:
    job = job_list(fetched_by=fetched_by).filter(id=job_id).first()
    if job is None:
        raise NotFound(f"Job {job_id} does not exist.")
    return job


def job_events(*, job: Job) -> QuerySet[JobEvent]:
    return job.events.order_by("id")
