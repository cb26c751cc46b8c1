"""A new job and its first event written by one statement.

On PostgreSQL the job row and its event go in one INSERT (the event's in a data-modifying
CTE over the job's), so a single submit costs one round trip and no transaction of its own:
one statement is atomic, and it commits alone in autocommit mode. Elsewhere (SQLite) the
two are written by the ORM in a transaction.
"""

from __future__ import annotations

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
