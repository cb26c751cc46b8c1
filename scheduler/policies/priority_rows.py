"""The priority policy's score inputs per queued job, kept across cycles by job object
(scheduler.policies.priority)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from scheduler.core.model import PendingJob
from scheduler.core.placement import FreeCapacity
from scheduler.policies.cycle_parts import (
    FractionColumns,
    QueueRest,
    ShapeColumns,
    TeamColumns,
    per_node_need,
)
from scheduler.policies.job_rows import JobRows, RankedJobs

# submitted, gpus, compute, id, nice, team/qos key; then what the walk reads (QueueRest):
# GPUs per node, time limit, asks for some GPU share, GPU model code (-1: any), team code,
# GPU equivalent; then the score's size and nice terms (filled by `order`, for the
# weights of `_terms_key`); then the request shape's code.
_COLUMNS = 15
_TERMS = 12
_SHAPE = 14


class Scores(Protocol):
    team_part: dict[str, float]
    qos_part: dict[str, float]
    qos_default: float

    def job_terms_key(self) -> Any: ...

    def job_terms(
        self, gpus: np.ndarray, compute: np.ndarray, nice: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def negated_scores(
        self,
        now: float,
        submitted: np.ndarray,
        teams: np.ndarray,
        qos: np.ndarray,
        size_terms: np.ndarray,
        nice_terms: np.ndarray,
    ) -> np.ndarray: ...


class QueueRows(JobRows):
    """The score inputs of pending jobs, kept across cycles by job object (JobRows)."""

    def _reset(self) -> None:
        self.slot: dict[int, int] = {}  # id(job) -> row
        self.jobs = np.empty(0, object)  # the job of each row (None: gone)
        self.used = 0  # rows handed out
        self.job_ids: set[int] = set()
        self.cols = np.zeros((_COLUMNS, 0))
        self.live = np.zeros(0, bool)
        self.keys: dict[tuple[str, str], int] = {}  # (team, qos) -> key
        self.key_list: list[tuple[str, str]] = []
        self.key_count: list[int] = []
        self.model_codes: dict[str, int] = {}  # GPU model -> code (no model asked: -1)
        self.team_codes: dict[str, int] = {}
        self.shape_codes: dict[tuple[Any, ...], int] = {}  # FreeCapacity.shape -> code
        # The queue of the last call while no rows are built (held, so ids stay unique).
        self._last: dict[int, PendingJob] = {}
        # The queue the rows were last brought up to (held, so its identity stays its own).
        self._synced: tuple[PendingJob, ...] | None = None
        # The rows in the order of the last call, and the rows handed out by then: the next
        # order starts from it (rows keep their numbers until `_grow` or `_reset`).
        self._ranked: np.ndarray | None = None
        self._ranked_used = 0
        # The weights the size and nice columns were filled for, and up to which row.
        self._terms_key: Any = None
        self._terms_upto = 0

    def _drop(self, gone: Iterable[int]) -> None:
        slot, jobs = self.slot, self.jobs
        for k in gone:
            row = slot.pop(k)
            self.job_ids.discard(jobs[row].id)
            jobs[row] = None
            self.live[row] = False
            self.key_count[int(self.cols[5, row])] -= 1

    def _add(self, added: list[PendingJob]) -> bool:
        if not added:
            return True
        ids = [j.id for j in added]
        if len(set(ids)) != len(ids) or not self.job_ids.isdisjoint(ids):
            self._reset()
            return False
        self.job_ids.update(ids)
        if self.used + len(added) > self.cols.shape[1]:
            self._grow(len(added))
        start, end = self.used, self.used + len(added)
        self.used = end
        self.slot.update(zip(map(id, added), range(start, end), strict=True))
        self.jobs[start:end] = added
        keys, key_list, key_count = self.keys, self.key_list, self.key_count
        models, teams = self.model_codes, self.team_codes
        pairs = [(j.team, j.qos) for j in added]
        for pair, count in Counter(pairs).items():
            key = keys.get(pair)
            if key is None:
                key = keys[pair] = len(key_list)
                key_list.append(pair)
                key_count.append(0)
            key_count[key] += count
        block = np.array(
            [
                (
                    j.submitted_at,
                    j.gpus,
                    j.gpu_compute_percent or 0,
                    j.id,
                    j.priority,
                    keys[p],
                    per_node_need(j),
                    j.time_limit,
                    bool(j.gpus or j.gpu_equivalent > 1e-6),
                    -1 if j.gpu_model is None else models.setdefault(j.gpu_model, len(models)),
                    teams.setdefault(j.team, len(teams)),
                    j.gpu_equivalent,
                )
                for j, p in zip(added, pairs, strict=True)
            ],
            float,
        ).reshape(len(added), _TERMS)
        self.cols[:_TERMS, start:end] = block.T
        shapes = self.shape_codes
        self.cols[_SHAPE, start:end] = [
            shapes.setdefault(FreeCapacity.shape(j), len(shapes)) for j in added
        ]
        self.live[start:end] = True
        return True

    def _renumbered(self, listed: list[PendingJob]) -> None:
        self._ranked = None
        self._terms_key = None

    def queued_teams(self) -> set[str]:
        return {t for (t, _), c in zip(self.key_list, self.key_count, strict=True) if c}

    def order(self, now: float, weights: Scores) -> tuple[RankedJobs, QueueRest]:
        """The queue by score (then submit time, then id), and its needs as the walk
        reads them."""
        team_part, qos_part = weights.team_part, weights.qos_part
        team_of_key = np.array([team_part.get(t, 0.0) for t, _ in self.key_list] or [0.0])
        qos_of_key = np.array(
            [qos_part.get(q, weights.qos_default) for _, q in self.key_list] or [0.0]
        )
        self._fill_terms(weights)
        rows = self._last_order()
        column = self.cols
        submitted, ids, key, size, nice = (
            column[c].take(rows) for c in (0, 3, 5, _TERMS, _TERMS + 1)
        )
        key = key.astype(np.int64)
        negated = weights.negated_scores(
            now, submitted, team_of_key[key], qos_of_key[key], size, nice
        )
        ranked = rows.take(_rank(negated, submitted, ids))
        self._ranked, self._ranked_used = ranked, self.used
        per_node, limits, share = (column[c].take(ranked) for c in (6, 7, 8))
        models, teams = tuple(self.model_codes), tuple(self.team_codes)

        def fractions() -> FractionColumns:
            compute, model = (column[c].take(ranked).astype(np.int64) for c in (2, 9))
            return FractionColumns(compute, model, models)

        def team_columns() -> TeamColumns:
            code, amount = (column[c].take(ranked) for c in (10, 11))
            return TeamColumns(code.astype(np.int64), amount, teams)

        def shape_columns() -> ShapeColumns:
            return ShapeColumns(column[_SHAPE].take(ranked).astype(np.int64), self.shape_codes)

        rest = QueueRest(
            per_node.astype(np.int64),
            limits,
            share > 0,
            fractions=fractions,
            teams=team_columns,
            shapes=shape_columns,
        )
        return RankedJobs(self.jobs, ranked, column[3]), rest

    def _fill_terms(self, weights: Scores) -> None:
        """The size and nice terms of the rows not filled yet for these weights."""
        key = weights.job_terms_key()
        start = self._terms_upto if key == self._terms_key else 0
        end = self.used
        if start < end:
            cols = self.cols
            cols[_TERMS : _TERMS + 2, start:end] = weights.job_terms(
                cols[1, start:end], cols[2, start:end], cols[4, start:end]
            )
        self._terms_key, self._terms_upto = key, end

    def _last_order(self) -> np.ndarray:
        """The live rows: in the order of the last call, the rows added since after them
        (scores move little between cycles, so this is nearly sorted already)."""
        ranked = self._ranked
        if ranked is None:
            return np.flatnonzero(self.live)
        live = self.live
        rows = ranked[live[ranked]]
        if self.used > self._ranked_used:
            added = np.arange(self._ranked_used, self.used)
            rows = np.concatenate((rows, added[live[added]]))
        return rows


def _rank(negated: np.ndarray, submitted: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`np.lexsort((ids, submitted, negated))`: by negated score (highest score first),
    then submit time, then id. A stable sort by score alone keeps nearly sorted input
    cheap; it is the lexsort's answer when every run of equal scores it leaves is in
    (submit time, id) order (ids are unique, so that order is the one answer), else the
    lexsort answers."""
    ranked = np.argsort(negated, kind="stable")
    if len(ranked) < 2:
        return ranked
    by_score = negated[ranked]
    if by_score[-1] != by_score[-1]:  # NaN (sorted last): left to the lexsort
        return np.lexsort((ids, submitted, negated))
    tied = np.flatnonzero(by_score[:-1] == by_score[1:])
    if len(tied):
        a, b = ranked[tied], ranked[tied + 1]
        sub_a, sub_b = submitted[a], submitted[b]
        if not ((sub_a < sub_b) | ((sub_a == sub_b) & (ids[a] < ids[b]))).all():
            return np.lexsort((ids, submitted, negated))
    return ranked
