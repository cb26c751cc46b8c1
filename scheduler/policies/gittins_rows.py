"""The Gittins policies' per-job inputs, kept across cycles by job object
(scheduler.policies.gittins): the index and the priority tier of every queued job, its
order and what the walk reads, as columns, so that a cycle looks at the new jobs only."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.core.model import PendingJob
from scheduler.core.placement import FreeCapacity
from scheduler.core.service_distribution import bucket
from scheduler.policies.cycle_parts import (
    FractionColumns,
    QueueRest,
    ShapeColumns,
    TeamColumns,
    per_node_need,
)
from scheduler.policies.gittins_columns import IndexModel, quota_within
from scheduler.policies.job_rows import JobRows, RankedJobs

# Columns: submitted, id, attained service, time limit, GPU equivalent, priority, QoS code,
# team code, GPUs per node, asks for some GPU share, compute share asked, GPU model code
# (-1: any); then filled for the distributions and settings of the cycle: bucket of the
# attained service (NaN: not computed), index, negated priority points, expected remaining
# service; then the request shape's code.
_SUBMITTED, _ID, _ATTAINED, _LIMIT, _GPUS, _PRIORITY, _QOS, _TEAM = range(8)
_PER_NODE, _SHARE, _COMPUTE, _MODEL, _BUCKET, _INDEX, _POINTS, _LEFT = range(8, 16)
_SHAPE = 16
_FROM_JOBS = 12
_COLUMNS = 17


@dataclass(frozen=True, eq=False)
class PointsRule:
    """A job's priority tier as gittins_tiers' `priority_points`: `qos_part(qos)` plus
    `w_job` times its priority (higher goes first); `key` says what it depends on."""

    qos_part: Any  # Callable[[str], float]
    w_job: float
    key: Any


@dataclass(frozen=True, eq=False)
class QuotaInputs:
    """What the pending jobs' quota tiers start from: the teams' GPU use (what they run)
    and their guaranteed GPUs."""

    usage: Mapping[str, float]
    guarantees: Mapping[str, int]


class RankedQueue:
    """One cycle's queue from the rows: the jobs in order, what the walk reads, and the
    per-job numbers the preemption rule asks for."""

    def __init__(
        self,
        jobs: Sequence[PendingJob],
        rest: QueueRest,
        index: np.ndarray,
        index_of: Mapping[int, float],
        tiers: Mapping[int, Any] | None,
        tier_columns: tuple[np.ndarray, np.ndarray] | None,
        cols: np.ndarray,
        rows: np.ndarray,
    ) -> None:
        self.jobs, self.rest = jobs, rest
        self.index = index  # per position
        self.index_of = index_of  # by job id
        self.tiers = tiers  # by job id: (negated points, quota tier)
        self.tier_columns = tier_columns  # per position: negated points, quota tier
        self._left, self._rows = cols[_LEFT], rows  # by row; the row of each position

    def remaining(self, positions: np.ndarray) -> np.ndarray:
        """Expected remaining service of the jobs at these positions."""
        return self._left.take(self._rows.take(positions))


class _ByRow(Mapping[int, Any]):
    """Per job id, a value read from columns by row."""

    def __init__(self, row_of: dict[int, int], get: Any) -> None:
        self._row_of, self._get = row_of, get

    def __getitem__(self, job_id: int) -> Any:
        return self._get(self._row_of[job_id])

    def __iter__(self) -> Iterator[int]:
        return iter(self._row_of)

    def __len__(self) -> int:
        return len(self._row_of)


class GittinsRows(JobRows):
    """The Gittins inputs of pending jobs, kept across cycles by job object.

    Rows are added and dropped as JobRows says (scheduler.policies.job_rows); a queue
    with a sort key that is not a plain number is left to the plain path too.

    The index column is recomputed (by columns) when the distributions change, and the
    queue's order by (tier points, index, submit time, id) is kept from cycle to cycle,
    the new jobs inserted; the quota tiers, which move with the teams' use, are worked
    out by columns every cycle.
    """

    def _reset(self) -> None:
        self.slot: dict[int, int] = {}  # id(job) -> row
        self.row_of: dict[int, int] = {}  # job id -> row
        self.jobs = np.empty(0, object)  # the job of each row (None: gone)
        self.used = 0
        self.cols = np.zeros((_COLUMNS, 0))
        self.live = np.zeros(0, bool)
        self.qos_codes: dict[str, int] = {}
        self.model_codes: dict[str, int] = {}
        self.team_codes: dict[str, int] = {}
        self.shape_codes: dict[tuple[Any, ...], int] = {}  # FreeCapacity.shape -> code
        self._last: dict[int, PendingJob] = {}
        self._synced: tuple[PendingJob, ...] | None = None
        # The rows by (points, index, submit time, id), valid for `_keys`, and the rows
        # handed out by then; the index and points filled up to `_filled`.
        self._ranked: np.ndarray | None = None
        self._ranked_used = 0
        self._keys: tuple[IndexModel, Any] | None = None
        self._filled = 0

    def _drop(self, gone: Iterable[int]) -> None:
        slot, jobs = self.slot, self.jobs
        for k in gone:
            row = slot.pop(k)
            del self.row_of[jobs[row].id]
            jobs[row] = None
            self.live[row] = False

    def _add(self, added: list[PendingJob]) -> bool:
        if not added:
            return True
        ids = [j.id for j in added]
        if len(set(ids)) != len(ids) or any(i in self.row_of for i in ids):
            self._reset()
            return False
        if self.used + len(added) > self.cols.shape[1]:
            self._grow(len(added))
        start, end = self.used, self.used + len(added)
        self.used = end
        self.slot.update(zip(map(id, added), range(start, end), strict=True))
        self.row_of.update(zip(ids, range(start, end), strict=True))
        self.jobs[start:end] = added
        qos, models, teams = self.qos_codes, self.model_codes, self.team_codes
        block = np.array(
            [
                (
                    j.submitted_at,
                    j.id,
                    j.attained_service,
                    j.time_limit,
                    j.gpu_equivalent,
                    j.priority,
                    qos.setdefault(j.qos, len(qos)),
                    teams.setdefault(j.team, len(teams)),
                    per_node_need(j),
                    bool(j.gpus or j.gpu_equivalent > 1e-6),
                    j.gpu_compute_percent or 0,
                    -1 if j.gpu_model is None else models.setdefault(j.gpu_model, len(models)),
                )
                for j in added
            ],
            float,
        ).reshape(len(added), _FROM_JOBS)
        self.cols[:_FROM_JOBS, start:end] = block.T
        self.cols[_BUCKET, start:end] = np.nan
        shapes = self.shape_codes
        self.cols[_SHAPE, start:end] = [
            shapes.setdefault(FreeCapacity.shape(j), len(shapes)) for j in added
        ]
        self.live[start:end] = True
        return True

    def _renumbered(self, listed: list[PendingJob]) -> None:
        self.row_of = {j.id: r for r, j in enumerate(listed)}
        self._ranked = None
        self._keys = None

    # -- one cycle's queue -------------------------------------------------------------

    def queue(
        self, model: IndexModel, points: PointsRule | None, quota: QuotaInputs | None
    ) -> RankedQueue | None:
        """The queue by (tier points, quota tier, index, submit time, id), as gittins'
        `queue_order` sorts it; None where a sort key is not a plain number (the plain
        path sorts those)."""
        keys = (model, points.key if points is not None else None)
        old = self._keys
        same = old is not None and model.same_as(old[0]) and old[1] == keys[1]
        start = self._filled if same else 0
        end = self.used
        if start < end:
            self._fill(start, end, model, points)
        self._keys, self._filled = keys, end
        if not same:
            self._ranked = None
        ranked = self._order()
        if ranked is None:
            return None
        cols = self.cols
        final, tier_columns = ranked, None
        quota_by_row: np.ndarray | None = None
        if quota is not None:
            team = cols[_TEAM].take(ranked).astype(np.int64)
            within = quota_within(
                team,
                cols[_GPUS].take(ranked),
                tuple(self.team_codes),
                quota.usage,
                quota.guarantees,
            )
            tier = (~within).astype(np.int64)  # WITHIN 0, BEYOND 1
            negated = cols[_POINTS].take(ranked)
            # The order is by points first: the quota tier splits each run of equal points.
            level = np.concatenate(([0], np.cumsum(negated[1:] != negated[:-1])))
            by_tier = np.argsort(2 * level + tier, kind="stable")
            final = ranked.take(by_tier)
            tier_columns = (negated.take(by_tier), tier.take(by_tier))
            quota_by_row = np.zeros(len(self.live), np.int64)
            quota_by_row[ranked] = tier
        per_node, limits, share, index = (
            cols[c].take(final) for c in (_PER_NODE, _LIMIT, _SHARE, _INDEX)
        )
        model_names, team_names = tuple(self.model_codes), tuple(self.team_codes)

        # The columns the walk reads only once it looks past what may start now.
        def fractions() -> FractionColumns:
            compute, models = (cols[c].take(final).astype(np.int64) for c in (_COMPUTE, _MODEL))
            return FractionColumns(compute, models, model_names)

        def teams() -> TeamColumns:
            code, gpus = cols[_TEAM].take(final).astype(np.int64), cols[_GPUS].take(final)
            return TeamColumns(code, gpus, team_names)

        def shapes() -> ShapeColumns:
            return ShapeColumns(cols[_SHAPE].take(final).astype(np.int64), self.shape_codes)

        rest = QueueRest(
            per_node.astype(np.int64),
            limits,
            share > 0,
            fractions=fractions,
            teams=teams,
            shapes=shapes,
        )
        index_col = cols[_INDEX]
        index_of = _ByRow(self.row_of, lambda r: float(index_col[r]))
        tiers = None
        if quota_by_row is not None:
            points_col, by_row = cols[_POINTS], quota_by_row
            tiers = _ByRow(self.row_of, lambda r: (float(points_col[r]), int(by_row[r])))
        return RankedQueue(
            RankedJobs(self.jobs, final, cols[_ID]),
            rest,
            index,
            index_of,
            tiers,
            tier_columns,
            cols,
            final,
        )

    def _fill(self, start: int, end: int, model: IndexModel, points: PointsRule | None) -> None:
        """The bucket, index, points and remaining service columns of rows start to end
        (gone rows too)."""
        cols = self.cols
        attained = cols[_ATTAINED, start:end]
        need = (model.ratios is None) | ~(cols[_LIMIT, start:end] * cols[_GPUS, start:end] > 0)
        need &= np.isfinite(attained) & np.isnan(cols[_BUCKET, start:end])
        for k in np.flatnonzero(need).tolist():
            cols[_BUCKET, start + k] = bucket(float(attained[k]))
        buckets = cols[_BUCKET, start:end]
        limits, gpus = cols[_LIMIT, start:end], cols[_GPUS, start:end]
        cols[_INDEX, start:end] = model.indices(attained, limits, gpus, buckets.take)
        cols[_LEFT, start:end] = model.remainings(attained, limits * gpus)
        if points is None:
            cols[_POINTS, start:end] = 0.0
        else:
            part = np.array([points.qos_part(q) for q in self.qos_codes] or [0.0], float)
            qos = cols[_QOS, start:end].astype(np.int64)
            cols[_POINTS, start:end] = -(part[qos] + points.w_job * cols[_PRIORITY, start:end])

    def _order(self) -> np.ndarray | None:
        """The live rows by (negated points, negated index, submit time, id): the order
        of the last call with the rows gone dropped and the new ones inserted, or sorted
        anew where the keys changed."""
        cols, live = self.cols, self.live
        ranked = self._ranked
        if ranked is None:
            rows = np.flatnonzero(live)
            if not self._finite(rows):
                return None
            c = cols[:, rows]
            ranked = rows.take(np.lexsort((c[_ID], c[_SUBMITTED], -c[_INDEX], c[_POINTS])))
        else:
            ranked = ranked[live[ranked]]
            if self.used > self._ranked_used:
                added = np.arange(self._ranked_used, self.used)
                added = added[live[added]]
                if not self._finite(added):
                    self._ranked = None
                    return None
                c = cols[:, added]
                added = added.take(np.lexsort((c[_ID], c[_SUBMITTED], -c[_INDEX], c[_POINTS])))
                ranked = np.insert(ranked, self._places(ranked, added), added)
        self._ranked, self._ranked_used = ranked, self.used
        return ranked

    def _finite(self, rows: np.ndarray) -> bool:
        c = self.cols
        return all(np.isfinite(c[k].take(rows)).all() for k in (_POINTS, _INDEX, _SUBMITTED))

    def _places(self, ranked: np.ndarray, added: np.ndarray) -> list[int]:
        """Where each added row goes in `ranked` (binary search on the sort key)."""
        cols = self.cols

        def key(row: Any) -> tuple[float, float, float, float]:
            return (
                float(cols[_POINTS, row]),
                -float(cols[_INDEX, row]),
                float(cols[_SUBMITTED, row]),
                float(cols[_ID, row]),
            )

        return [bisect.bisect_left(ranked, key(r), key=key) for r in added.tolist()]
