"""Per-job rows kept across cycles by job object, for the policies that keep their
queued jobs' inputs as columns (scheduler.policies.priority_rows, gittins_rows)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np

from scheduler.core.model import PendingChanges, PendingJob


class JobRows:
    """Rows of pending jobs, kept across cycles by job object.

    A driver that carries its (frozen) PendingJob objects over between snapshots (the
    simulator) adds the rows of new jobs and drops those of jobs gone; the rest are read
    from arrays. Where the snapshot says what joined and left since the queue of the last
    call (`Snapshot.pending_changes`), only those are looked at; otherwise the queues are
    compared. Only the very same object reuses a row (an id alone never does); a queue
    that lists one job twice, or two jobs with one id, is left to the plain path.

    Subclasses keep the columns: `_reset` (no rows; sets `slot`, `jobs`, `cols`, `live`,
    `used`, `_last` and `_synced`), `_drop` (the rows of these `id()`s go), `_add` (rows
    for these jobs; False, after a `_reset`, when an id repeats or is held already) and
    `_renumbered` (what they keep by row number, after `_grow`).
    """

    slot: dict[int, int]  # id(job) -> row
    jobs: np.ndarray  # the job of each row (None: gone)
    cols: np.ndarray  # one column per input, one entry per row
    live: np.ndarray  # per row: its job is queued
    used: int  # rows handed out
    # The queue of the last call while no rows are built (held, so ids stay unique).
    _last: dict[int, PendingJob]
    # The queue the rows were last brought up to (held, so its identity stays its own).
    _synced: tuple[PendingJob, ...] | None

    def __init__(self) -> None:
        self.builds = 0  # times the rows were built (for tests and benches)
        self.changes_used = 0  # syncs answered from the snapshot's pending_changes
        self._reset()

    def _reset(self) -> None:
        raise NotImplementedError

    def _drop(self, gone: Iterable[int]) -> None:
        raise NotImplementedError

    def _add(self, added: list[PendingJob]) -> bool:
        raise NotImplementedError

    def _renumbered(self, listed: list[PendingJob]) -> None:
        """The rows were renumbered by `_grow`: `listed` holds the job of each row."""
        raise NotImplementedError

    def _grow(self, more: int) -> None:
        """Room for `more` rows, dropping the rows of jobs gone."""
        rows = np.flatnonzero(self.live)
        kept = len(rows)
        size = max(64, 2 * (kept + more))
        cols = np.zeros((self.cols.shape[0], size))
        cols[:, :kept] = self.cols[:, rows]
        jobs = np.empty(size, object)
        jobs[:kept] = self.jobs[rows]
        self.cols, self.jobs, self.used = cols, jobs, kept
        self.live = np.zeros(size, bool)
        self.live[:kept] = True
        listed = jobs[:kept].tolist()
        self.slot = {id(j): r for r, j in enumerate(listed)}
        self._renumbered(listed)

    def sync(self, pending: tuple[PendingJob, ...], changes: PendingChanges | None = None) -> bool:
        """Bring the rows up to this queue; False when the plain path must answer."""
        if changes is not None and self._synced is not None and changes.before is self._synced:
            if self._apply(pending, changes):
                self.changes_used += 1
                self._synced = pending
                return True
        self._synced = None
        if self._compare(pending):
            self._synced = pending
            return True
        return False

    def _apply(self, pending: tuple[PendingJob, ...], changes: PendingChanges) -> bool:
        """Drop the rows of the jobs that left and add those that joined, when the changes
        are consistent with the rows and the queue (else nothing is touched)."""
        slot, jobs = self.slot, self.jobs
        removed, added = changes.removed, changes.added
        if len(pending) != len(slot) - len(removed) + len(added):
            return False
        gone = [id(j) for j in removed]
        if len(set(gone)) != len(gone):
            return False
        for key, job in zip(gone, removed, strict=True):
            row = slot.get(key)
            if row is None or jobs[row] is not job:
                return False
        if any(id(j) in slot for j in added):
            return False
        self._drop(gone)
        return self._add(list(added))

    def _compare(self, pending: tuple[PendingJob, ...]) -> bool:
        now = dict(zip(map(id, pending), pending, strict=True))
        if len(now) != len(pending):
            self._reset()
            return False
        slot = self.slot
        if not slot:
            # Rows are built on the first call that finds jobs of the last one: a driver
            # that builds new objects every cycle (production) takes the plain path.
            # (The objects of the last call are held, so a shared id is a shared object.)
            last, self._last = self._last, now
            if now.keys().isdisjoint(last):
                return not pending
            self.builds += 1
        gone = slot.keys() - now.keys()
        if slot and len(gone) == len(slot):
            # None of them is left: the plain path again until objects carry over.
            self._reset()
            self._last = now
            return not pending
        self._drop(gone)
        return self._add([now[k] for k in now.keys() - slot.keys()])


class RankedJobs(Sequence[PendingJob]):
    """A cycle's queue in ranked order, read from the rows' job column as the walk reaches
    it: a walk that settles early never builds the list of a long queue's jobs (each
    entry of such a list is a reference count to touch, on objects all over memory).

    In order, entries are listed a growing chunk at a time; an entry far ahead is read on
    its own; a slice past what is listed is another RankedJobs. Read it during the cycle
    it was made for: the rows change with the next sync."""

    __slots__ = ("_column", "_rows", "_listed", "_ids")

    def __init__(self, column: np.ndarray, rows: np.ndarray, ids: np.ndarray) -> None:
        """`column`: the job of each row; `rows`: the rows in order; `ids`: the job id of
        each row."""
        self._column = column
        self._rows = rows
        self._ids = ids
        self._listed: list[PendingJob] = []

    def job_ids(self) -> list[int]:
        """The jobs' ids in order, from the id column (no job object is read)."""
        ids: list[int] = self._ids.take(self._rows).astype(np.int64).tolist()
        return ids

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, key: int) -> PendingJob: ...

    @overload
    def __getitem__(self, key: slice) -> Sequence[PendingJob]: ...

    def __getitem__(self, key: int | slice) -> PendingJob | Sequence[PendingJob]:
        listed = self._listed
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self._rows))
            if step != 1:
                return list(self)[key]
            if stop <= len(listed):
                return listed[start:stop]
            return RankedJobs(self._column, self._rows[start:stop], self._ids)
        if key < 0:
            key += len(self._rows)
        if key < len(listed):
            return listed[key]
        if key == len(listed):
            self._list(key + 1)
            return listed[key]
        if not 0 <= key < len(self._rows):
            raise IndexError("queue position out of range")
        job: PendingJob = self._column[self._rows[key]]
        return job

    def __iter__(self) -> Iterator[PendingJob]:
        self._list(len(self._rows))
        return iter(self._listed)

    def _list(self, end: int) -> None:
        """List the entries up to `end` (and, going in order, a chunk beyond)."""
        listed = self._listed
        have = len(listed)
        if end > have:
            end = min(len(self._rows), max(end, 2 * have, 256))
            listed.extend(self._column.take(self._rows[have:end]).tolist())
