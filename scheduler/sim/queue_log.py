"""The queue's changes between two snapshots, as the simulator tells its policy
(scheduler.core.model.PendingChanges)."""

from __future__ import annotations

from scheduler.core.model import PendingChanges, PendingJob


class QueueLog:
    """Job objects that joined and left the queue since the last snapshot."""

    def __init__(self) -> None:
        self._before: tuple[PendingJob, ...] | None = None
        self._added: dict[int, PendingJob] = {}  # id(job) -> job
        self._removed: list[PendingJob] = []

    def joined(self, job: PendingJob) -> None:
        self._added[id(job)] = job

    def left(self, job: PendingJob) -> None:
        # One that joined since the last snapshot was never in it.
        if self._added.pop(id(job), None) is None:
            self._removed.append(job)

    def changes(self, pending: tuple[PendingJob, ...]) -> PendingChanges | None:
        """The changes from the last snapshot's queue to `pending` (None for the first)."""
        before, self._before = self._before, pending
        found = None
        if before is not None:
            found = PendingChanges(before, tuple(self._added.values()), tuple(self._removed))
        self._added, self._removed = {}, []
        return found
