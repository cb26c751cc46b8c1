"""The waiting jobs' order and wait reasons, stored by the cycle in one row.

A waiting job's position is its place in the order the last cycle left the waiting jobs in
(1: the next the policy considers), and its wait reason is the one that cycle's plan gave
it. Both move for thousands of jobs at once: every start or submit ahead of a job moves its
position, and a reason names the team's usage and the job GPUs are reserved for, which
change with any burst. Kept on each job row, they cost a row write per waiting job after a
burst (10,000 rows and 0.4-0.8 s of a cycle that dispatched 842 jobs). The cycle stores
instead, in one row (`QueueOrder`, pk 1) and only when they changed, the waiting jobs' ids
in order and their reasons (each distinct reason once, and per job the index of its own,
packed as machine integers): one write of about 100 kB for 10,000 jobs (about 10 ms),
however many jobs moved. Pages and the API read positions and reasons from it
(`queue_waits`), exact as of that cycle.

A job the last cycle did not leave waiting (submitted since, or no longer pending) is not
in it: it has no position yet, lists show it after those that have one, oldest first, and
its reason is its row's `state_reason` (what its last transition said). The cycle writes
neither `queue_position` nor the wait reason to job rows any more (it clears a position
left there; `scheduler.cycle.apply.clear_positions`).

The row is written under the scheduler lock, in one statement: a worker killed before it
leaves the previous cycle's order, which readers show until the next cycle.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID, uuid4

from django.utils import timezone

from scheduler.models import QueueOrder

ORDER_PK = 1


@dataclass(frozen=True)
class QueueWaits:
    """The stored order: job ids and their reasons, by position."""

    token: UUID | None = None
    ids: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()
    positions: dict[int, int] = field(default_factory=dict, compare=False)

    def position(self, job_id: int) -> int | None:
        return self.positions.get(job_id)

    def reason(self, job_id: int) -> str | None:
        """Why the job waits, as the last cycle said; None when it is not in the order."""
        n = self.positions.get(job_id)
        return None if n is None else self.reasons[n - 1]


# A job just submitted: no cycle has seen it.
NO_WAITS = QueueWaits()


def _parsed(token: UUID, ids: Sequence[int], reasons: Sequence[str]) -> QueueWaits:
    ids = tuple(int(i) for i in ids)
    return QueueWaits(
        token, ids, tuple(reasons), {job_id: n for n, job_id in enumerate(ids, start=1)}
    )


# Per process: the order last stored (by a cycle) or read (by a page), by its token.
_last: dict[str, QueueWaits] = {}


def _pack(kind: str, values: Sequence[int]) -> bytes:
    """Integers as little-endian machine words ("q": 64-bit ids, "I": 32-bit indexes)."""
    packed = array(kind, values)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _unpack(kind: str, data: bytes | memoryview | None) -> list[int]:
    packed = array(kind)
    packed.frombytes(bytes(data or b""))
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


def store_waits(waiting: Sequence[tuple[int, str]]) -> bool:
    """Store the waiting jobs (id, reason) in queue order, unless the stored row already
    says the same; whether it wrote. Called by the cycle, under the scheduler lock."""
    ids = tuple(job_id for job_id, _ in waiting)
    reasons = tuple(reason for _, reason in waiting)
    kept = _last.get("order")
    if kept is not None and kept.ids == ids and kept.reasons == reasons:
        token = QueueOrder.objects.filter(pk=ORDER_PK).values_list("token", flat=True).first()
        if token == kept.token:
            return False
    distinct: dict[str, int] = {}
    reason_of = [distinct.setdefault(reason, len(distinct)) for reason in reasons]
    token = uuid4()
    values = {
        "ids": _pack("q", ids),
        "reason_index": _pack("I", reason_of),
        "reasons": list(distinct),
        "token": token,
        "written_at": timezone.now(),
    }
    if not QueueOrder.objects.filter(pk=ORDER_PK).update(**values):
        QueueOrder.objects.create(pk=ORDER_PK, **values)
    _last["order"] = _parsed(token, ids, reasons)
    return True


def queue_waits() -> QueueWaits:
    """The stored order and reasons; parsed again only when the row's token changed since
    this process last read it (one short query otherwise)."""
    token = QueueOrder.objects.filter(pk=ORDER_PK).values_list("token", flat=True).first()
    if token is None:
        return NO_WAITS
    kept = _last.get("order")
    if kept is not None and kept.token == token:
        return kept
    row = (
        QueueOrder.objects.filter(pk=ORDER_PK)
        .values_list("token", "ids", "reason_index", "reasons")
        .first()
    )
    if row is None:
        return NO_WAITS
    token, packed_ids, packed_index, distinct = row
    ids = _unpack("q", packed_ids)
    reasons = [distinct[i] for i in _unpack("I", packed_index)]
    if len(reasons) != len(ids):  # a row not written by store_waits
        reasons = [""] * len(ids)
    parsed = _last["order"] = _parsed(token, ids, reasons)
    return parsed


def in_queue_order(
    rows: Iterable[tuple[int, Any]], waits: QueueWaits | None = None
) -> list[tuple[int, int | None]]:
    """(job id, position or None) of pending jobs, in queue order: `rows` are (job id,
    submitted_at); jobs with a position first, by it, then the others oldest first."""
    positions = (queue_waits() if waits is None else waits).positions
    far = len(positions) + 1
    ranked = sorted(rows, key=lambda r: (positions.get(r[0], far), r[1], r[0]))
    return [(job_id, positions.get(job_id)) for job_id, _ in ranked]
