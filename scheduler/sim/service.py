"""Sizes of the jobs finished so far, summarized for the snapshot as the production cycle
summarizes recent finished jobs (`Snapshot.service_distribution`, used by gittins)."""

from __future__ import annotations

from bisect import insort
from collections import deque

from scheduler.core.service_distribution import DEFAULT_POINTS, summarize_sorted


class ServiceHistory:
    """GPU-seconds of the last `window` finished jobs. The summary is recomputed once the
    history has grown by 2% (at least one job) since the last one, which keeps long replays
    cheap and changes the atoms by little."""

    def __init__(self, window: int = 5000, points: int = DEFAULT_POINTS) -> None:
        self.window, self.points = window, points
        self._recent: deque[float] = deque()
        self._sorted: list[float] = []
        self._atoms: tuple[float, ...] = ()
        self._new = 0

    def observe(self, gpu_seconds: float) -> None:
        if gpu_seconds <= 0:
            return
        self._recent.append(gpu_seconds)
        insort(self._sorted, gpu_seconds)
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            del self._sorted[self._sorted.index(old)]
        self._new += 1

    def atoms(self) -> tuple[float, ...]:
        if self._new and self._new >= len(self._sorted) // 50:
            self._atoms = summarize_sorted(self._sorted, self.points)
            self._new = 0
        return self._atoms
