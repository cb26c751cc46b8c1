"""What running jobs hold per team and per user, kept across cycles by job object: the
quota ledger's starting point without a pass over every running job in Python.

Each job object seen gets a row (team, user, GPU equivalent, host CPUs and memory), made
once; a cycle gathers the rows of its running jobs in their order and sums them by team and
by user with numpy. `np.bincount` adds the weights of each bin one after another in the
order given, starting from 0.0, which is the very float arithmetic of
`QuotaLedger.take` over the same jobs in the same order, so the totals are a fresh
ledger's to the last bit, fractions included, and the entries come in the order a fresh
ledger makes them (a team's first job first).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import numpy as np

from scheduler.core.model import RunningChanges, RunningJob

Totals = tuple[dict[str, float], dict[tuple[str, str], float], dict[str, int], dict[str, int]]

# Host CPUs or memory a row may hold for the totals to be summed in float64: with every
# term below 2**31 and fewer than 2**21 jobs, every partial sum is a whole number below
# 2**53, so exact. A job above it makes the ledger sum afresh.
_HOST_BOUND = 1 << 31


def host_share(job: Any) -> tuple[int, int]:
    """(CPU cores, memory MB) the job holds over all its nodes; (0, 0) cheaply when none."""
    cpus = getattr(job, "cpus", 0) or 0
    memory = getattr(job, "memory_mb", 0) or 0
    if not cpus and not memory:
        return 0, 0
    members = getattr(job, "members", None)
    nodes = 1 + len(members) if members is not None else job.nodes
    return cpus * nodes, memory * nodes


class RunningTotals:
    """What running jobs hold per team and per user, kept across cycles by job object.

    `sync` hands out the totals of the running jobs it is given (copies: the ledger changes
    them), or None where the ledger must be summed afresh: when none of the jobs was seen
    in the last call (a driver that builds new objects every cycle would pay for every
    row every cycle), or some job holds what cannot be summed exactly in float64. A row is
    never trusted by id alone: an id counts only while its row holds the very object.

    The same running tuple as the last call gives the last totals. Where the snapshot says
    which jobs started and stopped since the running jobs of the last call
    (`Snapshot.running_changes`), the new order is taken from the last one (the stopped
    jobs left out, the started ones after) and checked against the new list object by
    object; otherwise, or where it differs, each job's row is looked up.
    """

    def __init__(self) -> None:
        self.rebuilds = 0  # syncs that kept no job (for tests and benches)
        self.changes_used = 0  # syncs answered from the snapshot's running_changes
        self._reset()

    def _reset(self) -> None:
        self._rows: dict[int, int] = {}  # id(job) -> row
        size = 64
        self._objs = np.empty(size, dtype=object)  # row -> job (held: ids stay its own)
        self._team = np.zeros(size, dtype=np.intp)
        self._user = np.zeros(size, dtype=np.intp)
        self._amount = np.zeros(size, dtype=np.float64)
        self._cpus = np.zeros(size, dtype=np.float64)
        self._memory = np.zeros(size, dtype=np.float64)
        self._odd = np.zeros(size, dtype=bool)  # not summable in float64
        self._team_codes: dict[str, int] = {}
        self._teams: list[str] = []
        self._user_codes: dict[tuple[str, str], int] = {}
        self._users: list[tuple[str, str]] = []
        # The running jobs last synced to (held, so its identity stays its own), their rows
        # in order, each row's position in that order (-1: not in it), and their totals.
        self._synced: tuple[RunningJob, ...] | None = None
        self._order = np.zeros(0, dtype=np.intp)
        self._position = np.full(size, -1, dtype=np.intp)
        self._totals: Totals | None = None
        # The jobs of a call that found them new (held): a next call that finds some of
        # them makes rows.
        self._unseen: tuple[RunningJob, ...] = ()

    def sync(
        self, running: tuple[RunningJob, ...], changes: RunningChanges | None = None
    ) -> Totals | None:
        if running is not self._synced:
            order = None
            if changes is not None and self._synced is not None and changes.before is self._synced:
                order = self._order_after(running, changes)
                if order is not None:
                    self.changes_used += 1
            if order is None and len(running) == len(self._order) and self._same(running):
                order = self._order  # the same jobs in the same order, in a new list
            if order is None:
                order = self._gather(running)
            if order is None:
                return None
            if len(self._rows) > 2 * len(order) + 1024:
                order = self._compact(order)
            self._synced, self._order = running, order
            self._position[order] = np.arange(len(order), dtype=np.intp)
            self._totals = self._sum(order)
        totals = self._totals
        if totals is None:
            return None
        return dict(totals[0]), dict(totals[1]), dict(totals[2]), dict(totals[3])

    def _order_after(
        self, running: tuple[RunningJob, ...], changes: RunningChanges
    ) -> np.ndarray | None:
        """The rows of `running` when it is the last list less the stopped jobs, then the
        started ones (as a driver that keeps its running jobs in start order lists them),
        checked object by object; None otherwise."""
        order = self._order
        removed, added = changes.removed, changes.added
        if len(running) != len(order) - len(removed) + len(added):
            return None
        rows = self._rows
        gone = [rows.get(id(r), -1) for r in removed]
        if -1 in gone:
            return None
        keep = np.ones(len(order), dtype=bool)
        if gone:
            at = self._position[np.array(gone, dtype=np.intp)]
            if (at < 0).any():
                return None
            keep[at] = False
        new = np.array([self._row(r) for r in added], dtype=np.intp)
        found = np.concatenate((order[keep], new))
        if not self._same(running, found):
            return None
        self._position[order] = -1
        return found

    def _same(self, running: tuple[RunningJob, ...], order: np.ndarray | None = None) -> bool:
        """Whether the rows `order` (else the last order) hold these jobs in order: the very
        objects, or equal ones (a frozen job equal to another holds what it holds). The
        first few must be the very objects, so that a list of new copies is not compared
        field by field."""
        held = self._objs[self._order if order is None else order].tolist()
        if len(held) != len(running) or not all(map(operator.is_, held[:8], running[:8])):
            return False
        return bool(held == list(running))

    def _gather(self, running: tuple[RunningJob, ...]) -> np.ndarray | None:
        """The rows of `running` in order, made for jobs without one; None (and the rows
        dropped) when the jobs look new, none seen in the last call (see `_new`)."""
        rows = self._rows
        try:
            found = np.fromiter(map(rows.__getitem__, map(id, running)), np.intp, len(running))
        except KeyError:
            if self._new(running):
                if rows:
                    self.rebuilds += 1
                self._reset()
                self._unseen = running
                return None
            self._unseen = ()
            at = list(map(rows.get, map(id, running)))
            found = np.array(
                [self._row(r) if k is None else k for k, r in zip(at, running, strict=True)],
                dtype=np.intp,
            )
        self._position[self._order] = -1
        return found

    def _new(self, running: tuple[RunningJob, ...]) -> bool:
        """Whether none of a few jobs spread over the list has a row nor was in the last
        call that found its jobs new: a driver that builds new objects every cycle then
        pays for a look at a few of them, not for a row per job. (Only the cost rides on
        the answer: rows or a fresh sum give the same totals.)"""
        rows = self._rows
        probe = _spread(running)
        if any(id(r) in rows for r in probe):
            return False
        unseen = {id(r) for r in _spread(self._unseen)}
        return not any(id(r) in unseen for r in probe)

    def _row(self, job: Any) -> int:
        """The job's row, made when it has none."""
        row = self._rows.get(id(job))
        if row is not None:
            return row
        row = len(self._rows)
        if row == len(self._objs):
            self._grow()
        amount = job.gpu_equivalent
        cpus, memory = host_share(job)
        team, user = job.team, (job.team, job.user)
        code = self._team_codes.get(team)
        if code is None:
            code = self._team_codes[team] = len(self._teams)
            self._teams.append(team)
        self._team[row] = code
        code = self._user_codes.get(user)
        if code is None:
            code = self._user_codes[user] = len(self._users)
            self._users.append(user)
        self._user[row] = code
        exact = type(amount) is float and type(cpus) is int and type(memory) is int
        if exact and abs(cpus) < _HOST_BOUND and abs(memory) < _HOST_BOUND:
            self._amount[row], self._cpus[row], self._memory[row] = amount, cpus, memory
        else:
            self._odd[row] = True
        self._objs[row] = job
        self._rows[id(job)] = row
        return row

    def _grow(self) -> None:
        size = 2 * len(self._objs)
        self._resize(size, slice(None))
        position = np.full(size, -1, dtype=np.intp)
        position[: len(self._position)] = self._position
        self._position = position

    def _resize(self, size: int, rows: slice | np.ndarray) -> None:
        """Columns of `size` rows holding the given rows first."""
        for name in ("_objs", "_team", "_user", "_amount", "_cpus", "_memory", "_odd"):
            old = getattr(self, name)
            new = np.empty(size, object) if old.dtype == object else np.zeros(size, old.dtype)
            kept = old[rows]
            new[: len(kept)] = kept
            setattr(self, name, new)

    def _compact(self, order: np.ndarray) -> np.ndarray:
        """Drop the rows of jobs no longer running (the others renumbered in row order);
        `order` in the new numbers."""
        kept = np.unique(order)
        number = np.full(len(self._objs), -1, dtype=np.intp)
        number[kept] = np.arange(len(kept), dtype=np.intp)
        self._resize(len(self._objs), kept)
        self._position = np.full(len(self._objs), -1, dtype=np.intp)
        self._rows = {id(job): row for row, job in enumerate(self._objs[: len(kept)].tolist())}
        return number[order]

    def _sum(self, order: np.ndarray) -> Totals | None:
        if len(order) >= 1 << 21 or self._odd[order].any():
            return None
        team, user, amount = self._team[order], self._user[order], self._amount[order]
        return (
            _by_code(team, amount, self._teams),
            _by_code(user, amount, self._users),
            _host_by_team(team, self._cpus[order], self._teams),
            _host_by_team(team, self._memory[order], self._teams),
        )


def _spread(jobs: tuple[RunningJob, ...]) -> tuple[RunningJob, ...]:
    """A few jobs from all over the list (all of a short one)."""
    step = max(1, len(jobs) // 16)
    return jobs[::step] + jobs[-8:]


def _first_seen(codes: np.ndarray, count: int) -> np.ndarray:
    """The codes present, in the order of their first place in `codes`."""
    first = np.full(count, len(codes), dtype=np.intp)
    np.minimum.at(first, codes, np.arange(len(codes), dtype=np.intp))
    present = np.flatnonzero(first < len(codes))
    return present[np.argsort(first[present], kind="stable")]


def _by_code(codes: np.ndarray, weights: np.ndarray, names: list[Any]) -> dict[Any, float]:
    """Per name, its weights summed one after another in order (a float sum as
    `QuotaLedger.take` makes it), the names in the order they first appear."""
    if not len(codes):
        return {}
    sums = np.bincount(codes, weights=weights, minlength=len(names))
    present = _first_seen(codes, len(names))
    return dict(zip(_names(names, present), sums[present].tolist(), strict=True))


def _host_by_team(codes: np.ndarray, amounts: np.ndarray, names: list[str]) -> dict[str, int]:
    """Per team, the host CPUs (or memory) of its jobs that hold any, as whole numbers."""
    held = np.flatnonzero(amounts)
    if not len(held):
        return {}
    codes = codes[held]
    sums = np.bincount(codes, weights=amounts[held], minlength=len(names))
    present = _first_seen(codes, len(names))
    return dict(zip(_names(names, present), sums[present].astype(np.int64).tolist(), strict=True))


def _names(names: list[Any], codes: np.ndarray) -> Iterable[Any]:
    return map(names.__getitem__, codes.tolist())
