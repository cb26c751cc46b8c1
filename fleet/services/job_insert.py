"""A new job and its first event written by one statement.

On PostgreSQL the job row and its event go in one INSERT (the event's in a data-modifying
CTE over the job's), so a single submit costs one round trip and no transaction of its own:
one statement is atomic, and it commits alone in autocommit mode. Elsewhere (SQLite) the
two are written by the ORM in a transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model

from fleet.models import Job, JobEvent


@cache
def _insert_fields(model: type[Model], skip: frozenset[str]) -> tuple[Field, ...]:
    return tuple(
        f for f in model._meta.local_concrete_fields if not f.primary_key and f.name not in skip
    )


def _row(obj: Model, fields: tuple[Field, ...], connection: BaseDatabaseWrapper) -> list[Any]:
    # As Model.save() would: pre_save fills auto_now(_add) dates on the instance.
    return [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]


@cache
def _insert_sql() -> str:
    quote = connections[DEFAULT_DB_ALIAS].ops.quote_name
    job_fields = _insert_fields(Job, frozenset())
    event_fields = _insert_fields(JobEvent, frozenset({"job"}))
    job_cols = ", ".join(quote(f.column) for f in job_fields)
    event_cols = ", ".join(quote(f.column) for f in event_fields)
    job_pk = quote(Job._meta.pk.column)
    return (
        f"WITH j AS (INSERT INTO {quote(Job._meta.db_table)} ({job_cols}) "
        f"VALUES ({', '.join(['%s'] * len(job_fields))}) RETURNING {job_pk}) "
        f"INSERT INTO {quote(JobEvent._meta.db_table)} "
        f"({quote(JobEvent._meta.get_field('job').column)}, {event_cols}) "
        f"SELECT j.{job_pk}, {', '.join(['%s'] * len(event_fields))} FROM j "
        f"RETURNING {quote(JobEvent._meta.get_field('job').column)}, "
        f"{quote(JobEvent._meta.pk.column)}"
    )


def job_insert_with_event(*, job: Job, event: JobEvent) -> None:
    """Write the unsaved `job` and its unsaved first `event` (whose job is set on the way);
    both come back saved, with their ids and dates. Call with the job's fields final."""
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor != "postgresql":
        with transaction.atomic():
            job.save(force_insert=True)
            event.job = job
            event.save(force_insert=True)
        return
    params = _row(job, _insert_fields(Job, frozenset()), connection)
    params += _row(event, _insert_fields(JobEvent, frozenset({"job"})), connection)
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(), params)
        job_id, event_id = cursor.fetchone()
    for obj, pk in ((job, job_id), (event, event_id)):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias
    event.job = job


# Column types whose values the ORM passes to the driver as they are, when the value is a
# plain int, str, bool or None (an enum member or anything else takes the field's own
# preparation).
_PLAIN_COLUMNS = frozenset(
    {
        "BigIntegerField",
        "BooleanField",
        "CharField",
        "ForeignKey",
        "IntegerField",
        "PositiveIntegerField",
        "PositiveSmallIntegerField",
        "SmallIntegerField",
        "TextField",
    }
)
_PLAIN_VALUES = (int, str, bool, type(None))


def _column(objs: Sequence[Model], field: Field, connection: BaseDatabaseWrapper) -> list[Any]:
    if field.get_internal_type() in _PLAIN_COLUMNS:
        values = [getattr(obj, field.attname) for obj in objs]
        if all(type(v) in _PLAIN_VALUES for v in values):
            return values
    return [field.get_db_prep_save(field.pre_save(obj, True), connection) for obj in objs]


@cache
def _many_sql() -> tuple[str, str]:
    connection = connections[DEFAULT_DB_ALIAS]
    quote = connection.ops.quote_name
    job_fields = _insert_fields(Job, frozenset())
    event_fields = _insert_fields(JobEvent, frozenset({"job"}))
    arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in job_fields)
    jobs = (
        f"INSERT INTO {quote(Job._meta.db_table)} "
        f"({', '.join(quote(f.column) for f in job_fields)}) SELECT * FROM unnest({arrays}) "
        f"RETURNING {quote(Job._meta.pk.column)}"
    )
    job_column = quote(JobEvent._meta.get_field("job").column)
    events = (
        f"INSERT INTO {quote(JobEvent._meta.db_table)} "
        f"({job_column}, {', '.join(quote(f.column) for f in event_fields)}) "
        f"SELECT job_id, {', '.join(['%s'] * len(event_fields))} "
        f"FROM unnest(%s::{Job._meta.pk.db_type(connection)}[]) AS job_id"
    )
    return jobs, events


def jobs_insert_with_events(*, jobs: list[Job], event: JobEvent, batch: int = 2000) -> None:
    """Write the unsaved `jobs`, each with a first event like the unsaved `event` (its job
    left unset); the jobs come back saved, with their ids and dates, in their order. Call
    inside a transaction, with the jobs' fields final.

    On PostgreSQL the rows go as one array per column (`unnest`), so the per-row cost is
    the driver's, not the ORM's preparation of every field of every row; elsewhere the ORM
    writes them (`bulk_create`)."""
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor != "postgresql":
        saved = Job.objects.bulk_create(jobs, batch_size=batch)
        events = []
        for job in saved:
            one = JobEvent(
                job=job, **{f.attname: getattr(event, f.attname) for f in _event_fields()}
            )
            events.append(one)
        JobEvent.objects.bulk_create(events, batch_size=batch)
        return
    jobs_sql, events_sql = _many_sql()
    job_fields = _insert_fields(Job, frozenset())
    event_params = _row(event, _event_fields(), connection)
    with connection.cursor() as cursor:
        for start in range(0, len(jobs), batch):
            part = jobs[start : start + batch]
            cursor.execute(jobs_sql, [_column(part, f, connection) for f in job_fields])
            ids = [row[0] for row in cursor.fetchall()]
            for obj, pk in zip(part, ids, strict=True):
                obj.pk = pk
                obj._state.adding = False
                obj._state.db = connection.alias
            cursor.execute(events_sql, [*event_params, ids])


def _event_fields() -> tuple[Field, ...]:
    return _insert_fields(JobEvent, frozenset({"job"}))
