"""The queue's and the running jobs' changes between two snapshots, as the simulator tells
its policy (scheduler.core.model.PendingChanges and RunningChanges)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from scheduler.core.model import PendingChanges, PendingJob, RunningChanges, RunningJob

Job = TypeVar("Job", PendingJob, RunningJob)


class ChangeLog(Generic[Job]):
    """Job objects that joined and left a collection since the last snapshot."""

    def __init__(self, kind: Any) -> None:
        self._kind = kind  # PendingChanges or RunningChanges
        self._before: tuple[Job, ...] | None = None
        self._added: dict[int, Job] = {}  # id(job) -> job
        self._removed: list[Job] = []

    def joined(self, job: Job) -> None:
        self._added[id(job)] = job

    def left(self, job: Job) -> None:
        # One that joined since the last snapshot was never in it.
        if self._added.pop(id(job), None) is None:
            self._removed.append(job)

    def changes(self, now: tuple[Job, ...]) -> Any:
        """The changes from the last snapshot's collection to `now` (None for the first)."""
        before, self._before = self._before, now
        found = None
        if before is not None:
            found = self._kind(before, tuple(self._added.values()), tuple(self._removed))
        self._added, self._removed = {}, []
        return found


class QueueLog(ChangeLog[PendingJob]):
    """Pending job objects that joined and left the queue since the last snapshot."""

    def __init__(self) -> None:
        super().__init__(PendingChanges)

    def changes(self, now: tuple[PendingJob, ...]) -> PendingChanges | None:
        found: PendingChanges | None = super().changes(now)
        return found


class RunLog(ChangeLog[RunningJob]):
    """Running job objects that started and stopped since the last snapshot."""

    def __init__(self) -> None:
        super().__init__(RunningChanges)

    def changes(self, now: tuple[RunningJob, ...]) -> RunningChanges | None:
        found: RunningChanges | None = super().changes(now)
        return found
