"""Pieces of the policies' shared cycle (scheduler.policies.base): the held reservation
that backfill may fill around, the per-position needs of the rest of a queue that decide
when a walk can stop early, and the duration wording of wait reasons."""

from __future__ import annotations

from typing import Any

import numpy as np

from scheduler.core.model import PendingJob
from scheduler.core.placement import Choice, FreeCapacity


def duration(seconds: float) -> str:
    """'2h 05m', '45m', '30s': short enough for a reason sentence."""
    seconds = max(0, int(round(seconds)))
    if seconds >= 86400:
        return f"{seconds // 86400}d {seconds % 86400 // 3600}h"
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m"
    return f"{seconds}s"


class HeldReservation:
    """A reservation, with the free parts of its GPUs booked so long jobs go elsewhere."""

    def __init__(
        self,
        job_id: int,
        node: str,
        start: float,
        gpu_indices: tuple[int, ...],
        *,
        cache: bool = True,
    ):
        self.job_id, self.node, self.start, self.gpu_indices = job_id, node, start, gpu_indices
        self.cache = cache
        self.amounts: dict[int, tuple[int, int]] = {}
        # Request shapes that found no room on the reserved node, valid while the node's
        # capacity stays as it was after the last hold (its version).
        self._fails: set[tuple[Any, ...]] = set()
        self._version = -1

    def hold(self, cap: FreeCapacity) -> None:
        self.amounts = {i: cap.hold(self.node, i) for i in self.gpu_indices}

    def empty(self) -> bool:
        """Whether the reserved GPUs had nothing free to hold."""
        return not any(mem or comp for mem, comp in self.amounts.values())

    def fit_inside(self, cap: FreeCapacity, job: Any) -> Choice | None:
        """Place a job that ends before the reservation on the reserved node (GPUs included)."""
        shape = FreeCapacity.shape(job)
        if cap.node_version(self.node) != self._version:
            self._fails.clear()
        elif shape in self._fails:
            return None
        for i, amount in self.amounts.items():
            cap.unhold(self.node, i, amount)
        choice = cap.best_fit_on(job, self.node)
        if choice is not None:
            cap.take(job, *choice)
        self.hold(cap)
        if choice is None and self.cache:
            self._fails.add(shape)
            self._version = cap.node_version(self.node)
        return choice


class QueueRest:
    """Per position in a queue, what the jobs from there on need at least: whole GPUs
    (a fraction counts one), and whether any is a fraction; the same among those that
    end before a reservation starts."""

    def __init__(self, jobs: list[PendingJob]) -> None:
        n = len(jobs)
        gpus = np.fromiter([j.gpus for j in jobs], np.int64, n)
        limits = np.fromiter([j.time_limit for j in jobs], float, n)
        # Suffix minima / any, as Python values (the comparisons stay those of floats/ints).
        self._gpus, self._limits = gpus, limits
        self.need = np.minimum.accumulate(np.maximum(gpus, 1)[::-1])[::-1].tolist()
        self.fraction = np.logical_or.accumulate((gpus == 0)[::-1])[::-1].tolist()
        self._ending: tuple[float, float, list[int], list[bool]] | None = None

    def ending_by(self, now: float, start: float) -> tuple[list[int], list[bool]]:
        """Among the jobs from each position on that end by `start` when started at `now`:
        the fewest whole GPUs any needs (a fraction counts one; none: more than any node),
        and whether any is a fraction."""
        if self._ending is None or self._ending[:2] != (now, start):
            short = now + self._limits <= start
            need = np.where(short, np.maximum(self._gpus, 1), np.iinfo(np.int64).max)
            fraction = short & (self._gpus == 0)
            self._ending = (
                now,
                start,
                np.minimum.accumulate(need[::-1])[::-1].tolist(),
                np.logical_or.accumulate(fraction[::-1])[::-1].tolist(),
            )
        return self._ending[2], self._ending[3]
