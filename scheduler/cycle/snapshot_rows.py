"""The snapshot's job rows, read in full once and then only where they changed.

A control worker runs a cycle every few seconds over a queue that mostly stays as it was:
reading every pending and running row each time (13,000 rows on a 1,000-node fleet) cost
more than the policy. So a process keeps the rows it read, each with the version the
database gave it, and a later snapshot asks only for the ids and versions of the jobs that
are pending, assigned or running now; it reads in full just the rows that are new or whose
version differs, and drops the ids no longer there (finished, cancelled, deleted).

The version is PostgreSQL's `xmin`: the transaction that wrote the row as read. Every write
to a row, by any service, a trigger, an admin or psql, gives it a new one, so no writer has
to remember to bump a counter, and a row whose `xmin` is the one read is the row read. The
rows are read again in full (and the kept ones set aside) on any doubt:

- the first snapshot of a process, and every FULL_READ_EVERY_S seconds after that (which
  also keeps a kept version far younger than the 2^32 transactions after which a 32-bit
  `xmin` could come round again);
- a snapshot taken inside a transaction that has written (its own rows' versions would not
  tell its later writes from its earlier ones), which also keeps nothing;
- when most rows changed (one read of all is then cheaper than a read by ids);
- other databases than PostgreSQL (SQLite has no row versions): every snapshot reads all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

from django.db import connection
from django.db.models.expressions import RawSQL

from fleet.models import Job, JobState
from fleet.models.jobs import ACTIVE_STATES

# Seconds a process trusts its kept rows before it reads them all again, whatever their
# versions say: a bound on how long anything unforeseen could leave the snapshot stale.
FULL_READ_EVERY_S = 300.0
# Read all rows again rather than by ids when more than this share of them changed.
FULL_READ_SHARE = 0.3

QUEUED_STATES = (JobState.PENDING, *ACTIVE_STATES)


@dataclass
class KeptRows:
    """Rows of the last read, by job id: active (assigned/running) and pending rows, and the
    version (`xmin`) each was read at."""

    active: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    pending: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    versions: dict[int, str] = field(default_factory=dict)
    read_at: float | None = None
    # What the last read did, for tests and benches: "full" or "changes", and how many rows
    # it read in full.
    last: str = ""
    fetched: int = 0
    # The active and pending rows in id order as last returned, until a row is kept or
    # dropped: a read that finds nothing changed returns these very lists, which tells the
    # snapshot's later steps that what they built from them holds.
    lists: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]] | None = None

    def clear(self) -> None:
        self.active, self.pending, self.versions, self.read_at = {}, {}, {}, None
        self.lists = None


KEPT = KeptRows()


@dataclass(frozen=True)
class JobRows:
    """Active and pending rows in id order, and the ids whose rows were read in full by this
    read (None: all of them)."""

    active: list[tuple[Any, ...]]
    pending: list[tuple[Any, ...]]
    changed: set[int] | None


def version_column() -> RawSQL:
    """The row's version (`xmin`) as text, for a values list."""
    return RawSQL(f'"{Job._meta.db_table}"."xmin"::text', ())


def writing_transaction() -> bool:
    """Whether this connection is inside a transaction that has written something."""
    if not connection.in_atomic_block:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL")
        found = cursor.fetchone()
    return bool(found and found[0])


def _fetch(fields: Sequence[Any], states: Any, ids: list[int] | None) -> list[tuple[Any, ...]]:
    queryset = Job.objects.filter(state__in=states)
    if ids is not None:
        queryset = queryset.filter(id__in=ids)
    if connection.vendor == "postgresql":
        return list(queryset.values_list(*fields, version_column()))
    return list(queryset.values_list(*fields))


def read_job_rows(
    active_fields: Sequence[Any],
    pending_fields: Sequence[Any],
    *,
    kept: KeptRows = KEPT,
    now: float | None = None,
) -> JobRows:
    """The rows of assigned/running jobs (`active_fields`) and pending ones
    (`pending_fields`), each list in id order; the first field must be the id."""
    now = monotonic() if now is None else now
    if connection.vendor != "postgresql" or writing_transaction():
        kept.clear()
        kept.last, kept.fetched = "full", -1
        active = sorted(_fetch(active_fields, ACTIVE_STATES, None))
        pending = sorted(_fetch(pending_fields, (JobState.PENDING,), None))
        if connection.vendor == "postgresql":
            active = [r[:-1] for r in active]
            pending = [r[:-1] for r in pending]
        kept.fetched = len(active) + len(pending)
        return JobRows(active, pending, None)

    fresh = kept.read_at is not None and 0 <= now - kept.read_at < FULL_READ_EVERY_S
    ids: list[int] | None = None
    if fresh:
        scan = _scan()
        versions = kept.versions
        ids = [job_id for job_id, version in scan if versions.get(job_id) != version]
        if len(ids) > FULL_READ_SHARE * max(len(scan), 1):
            ids = None
        else:
            present = {job_id for job_id, _ in scan}
            for gone in [job_id for job_id in versions if job_id not in present]:
                _forget(kept, gone)
    if ids is None:
        kept.clear()
        kept.read_at = now
    for job_id in ids or ():
        _forget(kept, job_id)  # read again below, in whichever state it is now
    if ids != []:
        for row in _fetch(active_fields, ACTIVE_STATES, ids):
            kept.active[row[0]], kept.versions[row[0]] = row[:-1], row[-1]
        for row in _fetch(pending_fields, (JobState.PENDING,), ids):
            # Read second, so what it says is the newer (a job requeued in between).
            kept.active.pop(row[0], None)
            kept.pending[row[0]], kept.versions[row[0]] = row[:-1], row[-1]
    kept.last = "full" if ids is None else "changes"
    kept.fetched = len(kept.versions) if ids is None else len(ids)
    if kept.lists is None:
        kept.lists = (
            [kept.active[i] for i in sorted(kept.active)],
            [kept.pending[i] for i in sorted(kept.pending)],
        )
    return JobRows(kept.lists[0], kept.lists[1], None if ids is None else set(ids))


def _scan() -> list[tuple[int, str]]:
    """(id, version) of every pending, assigned and running job, through the cursor: the
    ORM's per-row work over every queued job cost as much as the query."""
    queryset = (
        Job.objects.filter(state__in=QUEUED_STATES).order_by().values_list("id", version_column())
    )
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _forget(kept: KeptRows, job_id: int) -> None:
    kept.active.pop(job_id, None)
    kept.pending.pop(job_id, None)
    kept.versions.pop(job_id, None)
    kept.lists = None


# Columns of a pending row (`snapshot._pending_fields()`) that are its wait as stored.
WAIT_REASON, WAIT_POSITION, WAIT_ETA = 15, 16, 17


def wait_versions(job_ids: Sequence[int], *, kept: KeptRows = KEPT) -> list[str] | None:
    """The versions the kept rows of these pending jobs were read at, or None unless every
    one of them is kept: a wait is then written only to the row as read (see
    `waits_written`)."""
    versions = kept.versions
    pending = kept.pending
    found = [versions.get(job_id) if job_id in pending else None for job_id in job_ids]
    if any(version is None for version in found):
        return None
    return found  # type: ignore[return-value]


def waits_written(
    written: Sequence[tuple[int, str, str, int | None, float | None]],
    *,
    kept: KeptRows = KEPT,
) -> None:
    """Keep the rows the cycle's wait write produced: (job id, new version, reason,
    position, ETA in seconds). The write was fenced on the version read, so each new row is
    the kept one with its wait replaced; the job objects built from the kept row stay theirs
    (the wait is not something the policy reads)."""
    from scheduler.cycle.snapshot_jobs import CARRIED

    carried = CARRIED.pending
    for job_id, version, reason, position, eta in written:
        old = kept.pending.get(job_id)
        if old is None:
            continue
        row = (*old[:WAIT_REASON], reason, position, eta, *old[WAIT_ETA + 1 :])
        kept.pending[job_id], kept.versions[job_id] = row, version
        kept.lists = None
        hit = carried.get(job_id)
        if hit is not None and hit[2] is old:
            carried[job_id] = (hit[0], hit[1], row)
