"""The running jobs' tiers of gittins-tiers, kept across cycles by job object
(scheduler.policies.gittins_tiers): each running job's priority points, its quota tier
(its team's running jobs counted by start time) and each team's GPU use.

Every running job object seen gets a row (team, GPU equivalent, start, id, negated points),
made once while the points rule is the same. A cycle whose running jobs are the very
objects of the last one, in the same order, with the same rule and guarantees, gets the
last answer again (the carried cycle of a driver where nothing started or stopped). Any
other cycle gathers the rows of its running jobs and works the answer out by columns: the
use per team summed in the snapshot's order by `np.bincount` (one weight after another from
0.0, as the job-by-job sum adds them), the quota tiers by `quota_within` over the jobs
sorted by (start, id) (a stable sort, as Python's), so the answer is the job-by-job one to
the bit. What the columns cannot hold exactly (an amount or start that is not a float, a
NaN start, an id beyond int64 or one twice, points that are not a float) goes the
job-by-job way, and so do running jobs all new to the rows and to the call before (a driver
that builds new objects every cycle would pay for a row per job every cycle).

`Snapshot.running_changes` is not needed: checking the objects one by one costs a tenth of
a millisecond for ten thousand jobs, and finding their rows about a millisecond.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from scheduler.core.model import RunningJob
from scheduler.policies.gittins_columns import quota_within

_ID_BOUND = 1 << 62
# A row per job object: its team's code, GPU equivalent, start, id, negated points, and
# whether the columns cannot hold it exactly.
_ROW = np.dtype(
    [
        ("team", np.intp),
        ("amount", np.float64),
        ("started", np.float64),
        ("id", np.int64),
        ("points", np.float64),
        ("odd", bool),
    ]
)
Answer = tuple[dict[int, Any], dict[str, float]]


class RunningTiers:
    """Per running job id its tier (negated points, quota tier: 0 within the team's
    guarantee, 1 beyond), and the GPUs each team runs, kept across cycles by job object.

    `rule` says what the points depend on (None: it cannot be told, nothing is kept) and
    `points` gives them; `guarantees` are the teams' guaranteed GPUs. `tiers` answers
    copies (the caller may change them) or None where the caller must work them out job by
    job. A row is never trusted by id alone: an id counts only while its row holds the very
    object.
    """

    def __init__(self) -> None:
        self.reused = 0  # calls answered with the last answer (for tests and benches)
        self.worked = 0  # calls answered from the rows
        self._rule: str | None = None
        self._reset()

    def _reset(self) -> None:
        self._rows: dict[int, int] = {}  # id(job) -> row
        self._objs = np.zeros(64, dtype=object)  # row -> job (held: ids stay its own)
        self._cols = np.zeros(64, dtype=_ROW)
        self._team_codes: dict[Any, int] = {}
        # The running jobs of the last answer (held), their rows, the guarantees and it.
        self._synced: tuple[RunningJob, ...] | None = None
        self._order = np.zeros(0, dtype=np.intp)
        self._guarantees: str | None = None
        self._last: Answer | None = None
        # The jobs of a call that found them all new (held, so their ids stay theirs) and
        # those ids: a next call that finds some of them makes rows.
        self._unseen: tuple[RunningJob, ...] = ()
        self._unseen_ids: set[int] = set()

    def tiers(
        self,
        running: tuple[RunningJob, ...],
        points: Callable[[Any], float],
        rule: str | None,
        guarantees: Mapping[str, Any],
    ) -> Answer | None:
        if rule is None or rule != self._rule:
            self._rule = rule
            self._reset()
            if rule is None:
                return None
        # repr tells apart what == does not (0 and 0.0, -0.0); a NaN guarantee, the same
        # repr whatever its bits, compares as any other NaN does.
        given = repr(tuple(guarantees.items()))
        same = self._same(running)
        if same and given == self._guarantees and self._last is not None:
            self.reused += 1
            return _copy(self._last)
        order: np.ndarray | None = self._order if same else self._gather(running, points)
        answer = None if order is None else self._work_out(order, guarantees)
        if order is None or answer is None:
            self._synced, self._last = None, None
            return None
        self.worked += 1
        self._synced, self._order, self._guarantees, self._last = running, order, given, answer
        return _copy(answer)

    def _same(self, running: tuple[RunningJob, ...]) -> bool:
        """Whether these are the very job objects of the last answer, in the same order."""
        held = self._synced
        if held is None:
            return False
        return running is held or (
            len(running) == len(held) and all(map(operator.is_, running, held))
        )

    def _gather(
        self, running: tuple[RunningJob, ...], points: Callable[[Any], float]
    ) -> np.ndarray | None:
        """The rows of `running` in order, made for jobs without one (all made afresh when
        the rows of jobs gone outnumber those running); None when the jobs look new (see
        `_new`)."""
        if len(self._rows) > 2 * len(running) + 1024:
            self._reset()
        at = list(map(self._rows.get, map(id, running)))
        if running and at.count(None) == len(at) and self._new(running):
            self._unseen, self._unseen_ids = running, set(map(id, running))
            return None
        self._unseen, self._unseen_ids = (), set()
        return np.array(
            [self._row(r, points) if k is None else k for k, r in zip(at, running, strict=True)],
            dtype=np.intp,
        )

    def _new(self, running: tuple[RunningJob, ...]) -> bool:
        """Whether none of the jobs was in the last call that found its jobs new: a driver
        that builds new objects every cycle (production) then pays for a look at them, not
        for a row per job, which costs more than the job-by-job way once. (Only the cost
        rides on the answer: the rows or the job-by-job way give the same tiers.)"""
        unseen = self._unseen_ids
        return not any(id(r) in unseen for r in running)

    def _row(self, job: Any, points: Callable[[Any], float]) -> int:
        row = len(self._rows)
        if row == len(self._objs):
            self._objs, self._cols = _doubled(self._objs), _doubled(self._cols)
        amount, started, job_id = job.gpu_equivalent, job.started_at, job.id
        negated = -points(job)
        code = self._team_codes.setdefault(job.team, len(self._team_codes))
        exact = type(amount) is float and type(started) is float and type(negated) is float
        exact = exact and type(job_id) is int and -_ID_BOUND < job_id < _ID_BOUND
        if exact and started == started:
            self._cols[row] = (code, amount, started, job_id, negated, False)
        else:
            self._cols[row]["odd"] = True
        self._objs[row] = job
        self._rows[id(job)] = row
        return row

    def _work_out(self, order: np.ndarray, guarantees: Mapping[str, Any]) -> Answer | None:
        """The tiers and the use of the jobs of these rows, in order, by columns; None
        where a row is odd or an id comes twice."""
        cols = self._cols[order]
        if cols["odd"].any():
            return None
        team, amount, ids = cols["team"], cols["amount"], cols["id"]
        names = tuple(self._team_codes)
        by_start = np.lexsort((ids, cols["started"]))
        within = quota_within(team[by_start], amount[by_start], names, {}, guarantees)
        quota = np.empty(len(order), dtype=np.int64)
        quota[by_start] = ~within  # 0 within, 1 beyond
        pairs = zip(cols["points"].tolist(), quota.tolist(), strict=True)
        tiers = dict(zip(ids.tolist(), pairs, strict=True))
        if len(tiers) != len(order):
            return None
        sums = np.bincount(team, weights=amount, minlength=len(names))
        codes, first = np.unique(team, return_index=True)
        present = codes[np.argsort(first, kind="stable")].tolist()
        usage = dict(zip(map(names.__getitem__, present), sums[present].tolist(), strict=True))
        return tiers, usage


def _copy(answer: Answer) -> Answer:
    return dict(answer[0]), dict(answer[1])


def _doubled(column: np.ndarray) -> np.ndarray:
    """The column with room for as many rows again."""
    bigger = np.zeros(2 * len(column), dtype=column.dtype)
    bigger[: len(column)] = column
    return bigger
