"""Sizes of the jobs finished so far, summarized for the snapshot as the production cycle
summarizes recent finished jobs (`Snapshot.service_distribution` and
`Snapshot.limit_ratio_distribution`, used by gittins)."""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque

from scheduler.core.service_distribution import DEFAULT_POINTS, summarize_sorted


class _Recent:
    """The last `window` positive values, kept sorted; summarized once they grew by 2%."""

    def __init__(self, window: int, points: int) -> None:
        self.window, self.points = window, points
        self._recent: deque[float] = deque()
        self._sorted: list[float] = []
        self._atoms: tuple[float, ...] = ()
        self._new = 0

    def add(self, value: float) -> None:
        if not (value > 0 and math.isfinite(value)):
            return
        self._recent.append(value)
        insort(self._sorted, value)
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._new += 1

    def atoms(self) -> tuple[float, ...]:
        if self._new and self._new >= len(self._sorted) // 50:
            self._atoms = summarize_sorted(self._sorted, self.points)
            self._new = 0
        return self._atoms


class ServiceHistory:
    """GPU-seconds and runtime / time limit of the last `window` finished jobs."""

    def __init__(self, window: int = 5000, points: int = DEFAULT_POINTS) -> None:
        self._sizes = _Recent(window, points)
        self._ratios = _Recent(window, points)

    def observe(self, gpu_seconds: float, limit_ratio: float = math.nan) -> None:
        """A finished job: its GPU-seconds and its runtime / time limit (nan: no limit)."""
        self._sizes.add(gpu_seconds)
        self._ratios.add(min(limit_ratio, 1.0))

    def atoms(self) -> tuple[float, ...]:
        return self._sizes.atoms()

    def ratio_atoms(self) -> tuple[float, ...]:
        return self._ratios.atoms()
