"""Pieces of the policies' shared cycle (scheduler.policies.base): the held reservation
that backfill may fill around, the per-position needs of the rest of a queue that decide
when a walk can stop early."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.core.model import FULL_COMPUTE, Member, PendingJob, TeamState
from scheduler.core.placement import Choice, FreeCapacity

_EPS = 1e-9  # as scheduler.core.quota


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


@dataclass(frozen=True, slots=True)
class FractionColumns:
    """Per queue position: the GPU compute share asked (0: none given) and the GPU model
    asked, as a code into `models` (-1: any model)."""

    compute: np.ndarray
    model: np.ndarray
    models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TeamColumns:
    """Per queue position: the job's team, as a code into `names`, and its GPU
    equivalent (PendingJob.gpu_equivalent)."""

    code: np.ndarray
    amount: np.ndarray
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShapeColumns:
    """Per queue position: the job's request shape (FreeCapacity.shape), as a code into
    `code_of` (shape -> code)."""

    code: np.ndarray
    code_of: Mapping[tuple[Any, ...], int]


class QueueRest:
    """Where in a queue the jobs are that might start, from what they need: whole GPUs on
    one node (a multi-node gang its GPUs per node; 0 for a fraction) and their time
    limits; and whether every one of them asks for some GPU share. With the jobs
    themselves (`jobs`), a fraction's compute share and GPU model are read too, once no
    GPU is wholly free, so that fractions no partly used GPU has room for are passed over."""

    def __init__(
        self,
        per_node: np.ndarray,
        limits: np.ndarray,
        share: np.ndarray,
        jobs: Sequence[PendingJob] | None = None,
        *,
        fractions: Callable[[], FractionColumns] | None = None,
        teams: Callable[[], TeamColumns] | None = None,
        shapes: Callable[[], ShapeColumns] | None = None,
    ) -> None:
        """`fractions` and `teams`: what the walk would otherwise read from `jobs`, where
        the caller keeps them as columns (per position, as `per_node`): functions that
        make them, called when the walk first needs them. `shapes`, likewise: with them,
        jobs of a shape that found no room are known not to start (see `may_start`)."""
        self.size = len(per_node)
        self._need = np.maximum(per_node, 1)  # a fraction needs one GPU with room
        self._fraction = per_node == 0
        self._limits = limits
        self.all_share = bool(share.all())
        self.jobs = jobs
        self._short: tuple[float, float, np.ndarray] | None = None
        # The fractions' positions, compute shares and model codes (-1: any model).
        self._fractions: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._models: list[str] = []
        self._fraction_columns = fractions
        self._teams = teams
        self._shape_columns = shapes
        self._shapes: ShapeColumns | None = None

    def guarantee_test(self, teams: Mapping[str, TeamState]) -> GuaranteeTest:
        """GuaranteeTest over this queue: from the team columns where given, else from
        the jobs."""
        if self._teams is not None:
            return GuaranteeTest.of_columns(self._teams(), teams)
        assert self.jobs is not None
        return GuaranteeTest(self.jobs, teams)

    @classmethod
    def of(cls, jobs: Sequence[PendingJob]) -> QueueRest:
        n = len(jobs)
        per_node = np.fromiter(map(per_node_need, jobs), np.int64, n)
        limits = np.fromiter([j.time_limit for j in jobs], float, n)
        share = np.fromiter([bool(j.gpus or j.gpu_equivalent > 1e-6) for j in jobs], bool, n)
        return cls(per_node, limits, share, jobs)

    def may_start(
        self,
        i: int,
        end: int,
        largest: int,
        partial: Mapping[str, int],
        short: tuple[float, float, int] | None,
        no_room: Collection[tuple[Any, ...]] = (),
    ) -> np.ndarray:
        """Over the positions from i up to `end`: whether the job needs at most `largest` GPUs, or
        is a fraction asking for no more compute than some partly used GPU of its model
        has free (`partial`: per model, the most free compute of such a GPU), and (with
        the shape columns) is not of a shape in `no_room` (shapes that found no room in
        this walk: free capacity only shrinks in it); or, with `short` = (now, start,
        room), ends by `start` when started at `now` and needs at most `room` GPUs or is
        a fraction."""
        need, fraction = self._need[i:end], self._fraction[i:end]
        mask = need <= largest
        if partial and largest < 1:  # (with a whole GPU free every fraction passes)
            if self.jobs is None and self._fraction_columns is None:
                mask |= fraction
            else:
                pos, comp, model = self._fractions_from(i, end)
                top = max(partial.values())
                bound = np.array([partial.get(m, 0) for m in self._models] + [top])
                mask[pos[comp <= bound[model]] - i] = True
        if no_room and self._shape_columns is not None:
            if self._shapes is None:
                self._shapes = self._shape_columns()
            code_of = self._shapes.code_of
            codes = [code_of[s] for s in no_room if s in code_of]
            if codes:
                gone = np.zeros(len(code_of), bool)
                gone[codes] = True
                mask &= ~gone[self._shapes.code[i:end]]
        if short is not None:
            now, start, room = short
            if self._short is None or self._short[:2] != (now, start):
                self._short = (now, start, now + self._limits <= start)
            mask |= self._short[2][i:end] & (fraction | (need <= room))
        return mask

    def _fractions_from(
        self, i: int, end: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fractions at positions from i up to `end` (None: on): positions, compute
        shares (at least 1, as a partly used GPU has), model codes into `_models` (-1: no
        model asked)."""
        if self._fractions is None and self._fraction_columns is not None:
            pos = np.flatnonzero(self._fraction)
            given = self._fraction_columns()
            comp = np.maximum(given.compute.take(pos), 1)
            self._models = list(given.models)
            self._fractions = (pos, comp, given.model.take(pos))
        if self._fractions is None:
            assert self.jobs is not None
            pos = np.flatnonzero(self._fraction)
            jobs = [self.jobs[p] for p in pos.tolist()]
            comp = np.fromiter((max(j.gpu_compute_percent or 0, 1) for j in jobs), np.int64)
            codes: dict[str | None, int] = {None: -1}
            model = np.fromiter(
                (codes.setdefault(j.gpu_model, len(codes) - 1) for j in jobs), np.int64
            )
            self._models = [m for m in codes if m is not None]
            self._fractions = (pos, comp, model)
        pos, comp, model = self._fractions
        s = int(np.searchsorted(pos, i))
        e = len(pos) if end is None else int(np.searchsorted(pos, end))
        return pos[s:e], comp[s:e], model[s:e]


class GuaranteeTest:
    """Which jobs of a queue keep their team within its guaranteed GPUs if added to what
    the team uses now (QuotaLedger.within_guarantee, the same float operations), over
    positions at once. Use only grows during a walk, so a job outside its guarantee stays
    outside: it cannot reclaim GPUs later in the walk either."""

    def __init__(self, jobs: Sequence[PendingJob], teams: Mapping[str, TeamState]) -> None:
        index: dict[str, int] = {}
        n = len(jobs)
        codes = np.fromiter((index.setdefault(j.team, len(index)) for j in jobs), np.int64, n)
        amounts = np.fromiter((j.gpu_equivalent for j in jobs), float, n)
        self._set(TeamColumns(codes, amounts, tuple(index)), teams)

    @classmethod
    def of_columns(cls, columns: TeamColumns, teams: Mapping[str, TeamState]) -> GuaranteeTest:
        test = cls.__new__(cls)
        test._set(columns, teams)
        return test

    def _set(self, columns: TeamColumns, teams: Mapping[str, TeamState]) -> None:
        self._codes, self._amounts = columns.code, columns.amount
        self._teams = list(columns.names)
        self._bounds = np.array([_guarantee(teams, t) + _EPS for t in self._teams] or [0.0], float)

    def within(self, i: int, end: int, usage: Mapping[str, float]) -> np.ndarray:
        """Over the positions from i up to `end`, with the teams' present use."""
        used = np.array([usage.get(t, 0.0) for t in self._teams] or [0.0], float)
        codes = self._codes[i:end]
        return used[codes] + self._amounts[i:end] <= self._bounds[codes]


def _guarantee(teams: Mapping[str, TeamState], slug: str) -> int:
    team = teams.get(slug)
    return team.guaranteed_gpus if team is not None else 0


def per_node_need(job: PendingJob) -> int:
    """Whole GPUs a job needs on one node (a multi-node gang's per node; 0: a fraction)."""
    if job.gpus_per_node and job.gpus > job.gpus_per_node:
        return job.gpus // (job.gpus // job.gpus_per_node)
    return job.gpus
