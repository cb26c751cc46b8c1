"""Pieces of the policies' shared cycle (scheduler.policies.base): the held reservation
that backfill may fill around, the per-position needs of the rest of a queue that decide
when a walk can stop early."""

from __future__ import annotations

from typing import Any

import numpy as np

from scheduler.core.model import FULL_COMPUTE, Member, PendingJob
from scheduler.core.placement import Choice, FreeCapacity


class HeldReservation:
    """A reservation, with the free parts of its GPUs booked so long jobs go elsewhere.

    A multi-node gang's reservation holds GPUs on every member's node, and on each of them
    the host CPUs and memory the job asks for (what is free of them; a one-node job's
    likewise), so a job that does not end before the reservation cannot take its hosts
    either. A one-node job that ends before the start may still use a held node (GPUs
    included).
    """

    def __init__(
        self,
        job_id: int,
        node: str,
        start: float,
        gpu_indices: tuple[int, ...],
        *,
        cache: bool = True,
        members: tuple[Member, ...] = (),
        host: tuple[int, int] = (0, 0),
    ):
        self.job_id, self.node, self.start, self.gpu_indices = job_id, node, start, gpu_indices
        self.members = (Member(node, gpu_indices), *members)
        self.nodes = tuple(m.node for m in self.members)
        self.host = host
        self.cache = cache
        self.amounts: dict[tuple[str, int], tuple[int, int]] = {}
        self.host_amounts: dict[str, tuple[int, int]] = {}
        # Request shapes that found no room on the reserved nodes, valid while their
        # capacity stays as it was after the last hold (their versions).
        self._fails: set[tuple[Any, ...]] = set()
        self._version: tuple[int, ...] = ()

    def hold(self, cap: FreeCapacity) -> None:
        self.amounts = {
            (m.node, i): cap.hold(m.node, i) for m in self.members for i in m.gpu_indices
        }
        if self.host[0] or self.host[1]:
            self.host_amounts = {n: cap.hold_host(n, *self.host) for n in self.nodes}

    def _unhold(self, cap: FreeCapacity) -> None:
        for (node, i), amount in self.amounts.items():
            cap.unhold(node, i, amount)
        for node, host in self.host_amounts.items():
            cap.unhold_host(node, host)

    def empty(self) -> bool:
        """Whether the reserved GPUs had nothing free to hold."""
        return not any(mem or comp for mem, comp in self.amounts.values())

    def whole_held(self, node: str) -> int:
        """GPUs held on a node that were wholly free."""
        return sum(
            1 for (n, _), (_, comp) in self.amounts.items() if n == node and comp >= FULL_COMPUTE
        )

    def fit_inside(self, cap: FreeCapacity, job: Any) -> Choice | None:
        """Place a one-node job that ends before the reservation on a reserved node (GPUs
        included)."""
        if job.gpus_per_node and job.gpus > job.gpus_per_node:
            return None
        shape = FreeCapacity.shape(job)
        version = tuple(cap.node_version(n) for n in self.nodes)
        if version != self._version:
            self._fails.clear()
        elif shape in self._fails:
            return None
        self._unhold(cap)
        choice = None
        for node in self.nodes:
            choice = cap.best_fit_on(job, node)
            if choice is not None:
                cap.take(job, *choice)
                break
        self.hold(cap)
        if choice is None and self.cache:
            self._fails.add(shape)
            self._version = tuple(cap.node_version(n) for n in self.nodes)
        return choice


class QueueRest:
    """Per position in a queue, what the jobs from there on need at least: whole GPUs on
    one node (a fraction counts one, a multi-node gang its GPUs per node), and whether any
    is a fraction; the same among those that end before a reservation starts."""

    def __init__(self, jobs: list[PendingJob]) -> None:
        n = len(jobs)
        per_node = [
            j.gpus // (j.gpus // j.gpus_per_node)
            if j.gpus_per_node and j.gpus > j.gpus_per_node
            else j.gpus
            for j in jobs
        ]
        gpus = np.fromiter(per_node, np.int64, n)
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
