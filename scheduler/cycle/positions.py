"""Queue positions: the waiting jobs' order, stored by the cycle in one row.

A waiting job's position is its place in the order the last cycle left the waiting jobs in
(1: the next the policy considers). Every start or submit ahead of a job moves it, so a
position kept on each job row cost a row write per waiting job after any burst (10,000 rows
and 0.4-0.8 s of a cycle that dispatched 842 jobs). The cycle stores instead the whole order,
the waiting jobs' ids, in one row (`QueueOrder`, pk 1), and only when it changed: one write
of a few tens of kilobytes, however many jobs moved. Pages and the API read positions from
it (`queue_positions`, `in_queue_order`), exact as of that cycle. A job submitted since is
not in it: it has no position yet, and lists show it after those that have one, oldest
first. The job rows' `queue_position` column is no longer written (the cycle clears any
value left there; see `scheduler.cycle.apply.wait_rows`).

The row is written under the scheduler lock, as one statement: a worker killed before it
leaves the previous cycle's order, which readers show until the next cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

from django.utils import timezone

from scheduler.models import QueueOrder

ORDER_PK = 1


@dataclass(frozen=True)
class _Parsed:
    token: UUID
    ids: tuple[int, ...]
    positions: dict[int, int]


# Per process: the order last stored (by a cycle) or read (by a page), by its token.
_last: dict[str, _Parsed] = {}


def _parsed(token: UUID, ids: Sequence[int]) -> _Parsed:
    ids = tuple(int(i) for i in ids)
    return _Parsed(token, ids, {job_id: n for n, job_id in enumerate(ids, start=1)})


def store_order(job_ids: Sequence[int]) -> bool:
    """Store the waiting jobs' ids in queue order, unless the stored order is already this
    one; whether it wrote. Called by the cycle, under the scheduler lock."""
    ids = tuple(job_ids)
    kept = _last.get("order")
    if kept is not None and kept.ids == ids:
        token = QueueOrder.objects.filter(pk=ORDER_PK).values_list("token", flat=True).first()
        if token == kept.token:
            return False
    token = uuid4()
    values = {"job_ids": list(ids), "token": token, "written_at": timezone.now()}
    if not QueueOrder.objects.filter(pk=ORDER_PK).update(**values):
        QueueOrder.objects.create(pk=ORDER_PK, **values)
    _last["order"] = _parsed(token, ids)
    return True


def _current() -> _Parsed | None:
    """The stored order; parsed again only when its token changed since this process last
    read it (one short query otherwise)."""
    token = QueueOrder.objects.filter(pk=ORDER_PK).values_list("token", flat=True).first()
    if token is None:
        return None
    kept = _last.get("order")
    if kept is not None and kept.token == token:
        return kept
    row = QueueOrder.objects.filter(pk=ORDER_PK).values_list("token", "job_ids").first()
    if row is None:
        return None
    parsed = _last["order"] = _parsed(row[0], row[1] or [])
    return parsed


def queue_positions(job_ids: Iterable[int] | None = None) -> dict[int, int]:
    """Job id -> queue position as of the last cycle, for the given jobs (all when None);
    a job the last cycle did not leave waiting is absent. Only meaningful for jobs that are
    pending now: callers show no position for others."""
    order = _current()
    if order is None:
        return {}
    if job_ids is None:
        return order.positions
    positions = order.positions
    return {job_id: positions[job_id] for job_id in job_ids if job_id in positions}


def in_queue_order(rows: Iterable[tuple[int, Any]]) -> list[tuple[int, int | None]]:
    """(job id, position or None) of pending jobs, in queue order: `rows` are (job id,
    submitted_at); jobs with a position first, by it, then the others oldest first."""
    positions = queue_positions()
    far = len(positions) + 1
    ranked = sorted(rows, key=lambda r: (positions.get(r[0], far), r[1], r[0]))
    return [(job_id, positions.get(job_id)) for job_id, _ in ranked]
