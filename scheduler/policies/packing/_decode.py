"""Turning a job order into placements (the greedy placer), and scoring the result.

The placer walks jobs in the given order and books each at its best fit, within quota. The
genetic and annealing policies search over orders and use `Evaluator` to score each one:
placed value minus a penalty for the fragmentation the placements leave behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from scheduler.core.model import PendingJob, Place
from scheduler.core.placement import FreeCapacity
from scheduler.core.quota import QuotaLedger


def place_in_order(
    jobs: Iterable[PendingJob], cap: FreeCapacity, room: QuotaLedger, reason: str = "best fit"
) -> list[Place]:
    """Book each job, in order, at its best fit when its quota allows (a multi-node gang
    on all its nodes or not at all); returns the places."""
    places: list[Place] = []
    for job in jobs:
        if room.check(job) is not None:
            continue
        if job.gpus_per_node and job.gpus > job.gpus_per_node:
            members = cap.best_fit_members(job)
            if members is None:
                continue
            cap.take_members(job, members)
            room.take(job)
            first = members[0]
            places.append(Place(job.id, first.node, first.gpu_indices, reason, members[1:]))
            continue
        choice = cap.best_fit(job)
        if choice is None:
            continue
        node, indices = choice
        cap.take(job, node, indices)
        room.take(job)
        places.append(Place(job.id, node, indices, reason))
    return places


def node_fragmentation(cap: FreeCapacity, node: str, size: int) -> int:
    """Free GPUs a large gang cannot use: wholly free GPUs on a node that is not wholly
    free, plus GPUs partly used by fractions (free capacity only fractions can use)."""
    whole = cap.whole_free(node)
    stranded = len(whole) if len(whole) < size else 0
    partial = 0
    for gpu in cap.node_gpus(node):
        if gpu.index in whole:
            continue
        mem, comp = cap.free_on(node, gpu.index)
        if mem > 0 and comp > 0:
            partial += 1
    return stranded + partial


class Evaluator:
    """Scores job orders on a shared FreeCapacity, undoing each trial after scoring it."""

    def __init__(
        self,
        jobs: Sequence[PendingJob],
        values: Mapping[int, float],
        cap: FreeCapacity,
        room: QuotaLedger,
        penalty: float,
        tail: Sequence[PendingJob] = (),
    ) -> None:
        self.jobs = list(jobs)
        # Decoded after each order, in its own fixed order: a search over the head is
        # scored by the whole plan it leads to.
        self.tail = list(tail)
        self.values = values
        self.cap = cap
        self.room = room
        self.penalty = penalty
        self.evaluations = 0
        self._cache: dict[tuple[int, ...], float] = {}
        self._sizes = {name: len(cap.node_gpus(name)) for name in cap.node_names()}
        self._base: dict[str, int] = {}
        self._by_id = {j.id: j for j in self.jobs + self.tail}

    def _frag(self, node: str) -> int:
        return node_fragmentation(self.cap, node, self._sizes[node])

    def fitness(self, perm: Sequence[int]) -> float:
        """Placed value minus penalty x added fragmentation, for jobs in order `perm`
        (positions into `jobs`) then the tail. Capacity and quota are left as they were."""
        key = tuple(perm)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        self.evaluations += 1
        places = self.decode(key)
        places += place_in_order(self.tail, self.cap, self.room, "best fit")
        value = sum(self.values[p.job_id] for p in places)
        touched = {m.node for p in places for m in p.allocations}
        frag_after = sum(self._frag(node) for node in touched)
        self.undo(places)
        # Measured on the untouched capacity, once per node.
        for node in touched - self._base.keys():
            self._base[node] = self._frag(node)
        frag_before = sum(self._base[node] for node in touched)
        score = value - self.penalty * (frag_after - frag_before)
        self._cache[key] = score
        return score

    def decode(self, perm: Sequence[int]) -> list[Place]:
        return place_in_order((self.jobs[i] for i in perm), self.cap, self.room, "packing search")

    def undo(self, places: Sequence[Place]) -> None:
        for place in reversed(places):
            job = self._by_id[place.job_id]
            self.cap.release_members(job, place.allocations)
            self.room.release(job)
