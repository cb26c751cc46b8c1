"""Many jobs with their first events written as one array per column (bulk submits and
arrays): every stored value equals what the ORM writes for the same unsaved jobs."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.forms.models import model_to_dict

from fleet.models import Job, JobEvent, JobState
from fleet.models.jobs import ActorKind, JobArray
from fleet.services.job_insert import jobs_insert_with_events

pytestmark = pytest.mark.django_db

SKIP = {"id", "submitted_at", "updated_at", "array"}  # each path has its own array


def _jobs(owner: Any, team: Any, array: JobArray | None) -> list[Job]:
    return [
        Job(owner=owner, team=team, name="plain", command="python a.py", time_limit=60),
        Job(
            owner=owner, team=team, name="everything é", command="echo 'x'\n", time_limit=7200,
            gpus=2, gpus_per_node=1, same_group=True, env={"SEED": "1", "E": ""}, workdir="/d",
            priority=-3, qos="high", preemptible=True, max_requeues=5, cpus=8, memory_mb=4096,
            gpu_model="A100", min_gpu_memory_mb=40000, state=JobState.PENDING,
            array=array, array_index=7,
        ),
        Job(
            owner=owner, team=team, name="fraction", command="c", time_limit=60, gpus=0,
            gpu_memory_mb=2048, gpu_compute_percent=25, state_reason="",
        ),
    ]  # fmt: skip


def _event(actor: str) -> JobEvent:
    return JobEvent(
        from_state="", to_state=JobState.PENDING, attempt=0, reason="submitted",
        actor_kind=ActorKind.USER, actor=actor,
    )  # fmt: skip


def _stored(jobs: list[Job]) -> list[tuple[dict[str, Any], list[tuple[Any, ...]]]]:
    out = []
    for job in jobs:
        row = {k: v for k, v in model_to_dict(Job.objects.get(pk=job.pk)).items() if k not in SKIP}
        events = list(
            JobEvent.objects.filter(job=job).values_list(
                "from_state", "to_state", "attempt", "reason", "actor_kind", "actor"
            )
        )
        out.append((row, events))
    return out


def test_rows_equal_what_the_orm_writes(owner: Any, team: Any) -> None:
    arrays = [
        JobArray.objects.create(owner=owner, team=team, name="a", spec="3", task_count=3)
        for _ in range(2)
    ]
    by_orm = Job.objects.bulk_create(_jobs(owner, team, arrays[0]))
    JobEvent.objects.bulk_create([JobEvent(job=j, **_fields(_event("owner"))) for j in by_orm])
    by_columns = _jobs(owner, team, arrays[1])
    with transaction.atomic():
        jobs_insert_with_events(jobs=by_columns, event=_event("owner"), batch=2)
    assert all(j.pk is not None and not j._state.adding for j in by_columns)
    assert len({j.pk for j in by_orm + by_columns}) == 6
    assert Job.objects.get(pk=by_columns[1].pk).array_id == arrays[1].pk
    assert _stored(by_columns) == _stored(by_orm)
    # The jobs come back with the dates they were stored with.
    for job in by_columns:
        stored = Job.objects.get(pk=job.pk)
        assert (stored.submitted_at, stored.updated_at) == (job.submitted_at, job.updated_at)


def _fields(event: JobEvent) -> dict[str, Any]:
    return {
        f.attname: getattr(event, f.attname)
        for f in JobEvent._meta.local_concrete_fields
        if not f.primary_key and f.name != "job"
    }


def test_a_refused_row_writes_nothing(owner: Any, team: Any) -> None:
    jobs = _jobs(owner, team, None)
    jobs[2].time_limit = 0  # the table's check refuses it
    before = (Job.objects.count(), JobEvent.objects.count())
    with pytest.raises(IntegrityError), transaction.atomic():
        jobs_insert_with_events(jobs=jobs, event=_event("owner"), batch=2)
    assert (Job.objects.count(), JobEvent.objects.count()) == before


def test_postgresql_writes_columns_not_rows(owner: Any, team: Any) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the column path is PostgreSQL's; elsewhere the ORM writes the rows")
    from django.test.utils import CaptureQueriesContext

    jobs = [
        Job(owner=owner, team=team, name=f"j{i}", command="c", time_limit=60) for i in range(50)
    ]
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        jobs_insert_with_events(jobs=jobs, event=_event("owner"))
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 2 and all("unnest" in sql for sql in inserts)
    assert [j.name for j in Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pk")] == [
        f"j{i}" for i in range(50)
    ]
