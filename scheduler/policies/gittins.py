"""Gittins index, preemptive (Tiresias's discretized 2D-Gittins over attained GPU-seconds)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from scheduler.core.model import PendingJob, Plan, RunningJob, Snapshot
from scheduler.core.preemption_cost import PreemptionCost
from scheduler.core.service_distribution import ServiceDistribution
from scheduler.policies.base import Cycle
from scheduler.policies.cycle_parts import QueueRest
from scheduler.policies.cycle_preempt import Reason
from scheduler.policies.gittins_columns import RATIO_STEPS, IndexModel
from scheduler.policies.gittins_hint import _SLACK, may_allow_any
from scheduler.policies.gittins_rows import GittinsRows, PointsRule, QuotaInputs, RankedQueue
from scheduler.policies.preemptive import PreemptivePolicy

__all__ = ["RATIO_STEPS", "GittinsPolicy", "Tiers", "queue_order"]

DEFAULT_MARGIN = 0.5  # a waiting job preempts only with an index 1.5x the runner's
DEFAULT_MIN_SLICE = 300.0  # seconds a job runs before it may be preempted again


# A tier per job (smaller goes first; GittinsPolicy.tiers): pending and running jobs by id.
Tiers = tuple[Mapping[int, Any], Mapping[int, Any]]


class GittinsPolicy(PreemptivePolicy):
    """Jobs go in order of their Gittins index: the chance to finish soon per GPU-second
    spent, given the GPU-seconds a job has attained over all its attempts. The job's size
    distribution is learned from recently finished jobs: with
    `Snapshot.limit_ratio_distribution` (runtime / time limit) it is limit x GPUs x that
    ratio, so the limit bounds it and scales it (attained service rounded down to 1/64th of
    limit x GPUs); otherwise `Snapshot.service_distribution` (GPU-seconds) cut at limit x
    GPUs, attained service bucketed on a geometric grid (4 steps per doubling). Settings
    "gittins_use_limits" (default on) off ignores limits: plain Tiresias. Submit order breaks
    ties. A waiting job that does not fit may preempt preemptible running jobs whose index
    is lower by the margin (settings "gittins_margin", default 0.5: 1.5x) and that have run
    at least the minimum slice in their current attempt (settings "gittins_min_slice",
    default 300 s), so that jobs do not thrash; settings "gittins_preemption" (default on)
    turns this off. It preempts only when that pays for itself (settings
    "preemption_gain_check", default on): the waiting job's expected remaining service (from
    the same distribution, `mean_residual`) plus the preemption's cost (restart and lost
    progress, `PreemptionCost`) is below the victim's, and the progress it throws away (all
    of the attempt for a job without checkpoints) is at most `PreemptionCost.loss_bound`
    (16) times what the waiting job is expected to need; a job preempted
    "preemption_max_per_job" times (default 10) is not preempted again. Without any
    distribution (fewer than 20 finished jobs) the index is 1 / (attained + 1): least
    attained service.

    Trade-off: needs no runtime estimates and learns from history how long jobs run and how
    much users over-ask; heavy tails make it least-attained-service, jobs near their limit
    are finished first. It preempts (restart and checkpoint costs), long jobs wait while
    short ones keep arriving, and one ratio distribution for everyone fits users who
    over-ask alike better than a mix.
    """

    name = "gittins"

    def __init__(
        self,
        margin: float | None = None,
        min_slice: float | None = None,
        use_limits: bool | None = None,
        **params: Any,
    ) -> None:
        super().__init__(**params)
        self.margin, self.min_slice, self.use_limits = margin, min_slice, use_limits
        self._dist: ServiceDistribution | None = None
        self._ratios: ServiceDistribution | None = None
        self._rows = GittinsRows()

    def _distribution(self, atoms: tuple[float, ...]) -> ServiceDistribution | None:
        """The distribution for these atoms, kept across cycles (with its index cache)."""
        if not atoms:
            return None
        if self._dist is None or self._dist.atoms != atoms:
            self._dist = ServiceDistribution(atoms)
        return self._dist

    def _ratio_distribution(self, atoms: tuple[float, ...]) -> ServiceDistribution | None:
        if not atoms:
            return None
        if self._ratios is None or self._ratios.atoms != atoms:
            self._ratios = ServiceDistribution(atoms)
        return self._ratios

    def tiers(self, snapshot: Snapshot, index: Callable[[PendingJob], float]) -> Tiers | None:
        """Tiers that come before the index (None: none, plain Gittins order). Jobs go by
        tier first, and a job never preempts one of a tier that goes before its own."""
        return None

    def tier_columns(self, snapshot: Snapshot, tier: Mapping[int, Any]) -> tuple[np.ndarray, ...]:
        """The tiers of the pending jobs (in snapshot order) as sort keys, most
        significant first, comparing as the tiers do (a policy with `tiers` says how)."""
        raise NotImplementedError

    def row_tiers(
        self, snapshot: Snapshot
    ) -> tuple[PointsRule, QuotaInputs, dict[int, Any]] | None:
        """What the rows kept across cycles need to work out `tiers` by columns: the rule
        for the pending jobs' priority points, what their quota tiers start from, and the
        running jobs' tiers (None: no tiers)."""
        return None

    def schedule(self, snapshot: Snapshot) -> Plan:
        now = snapshot.now
        margin = float(self.setting(snapshot, self.margin, "gittins_margin", DEFAULT_MARGIN))
        min_slice = float(
            self.setting(snapshot, self.min_slice, "gittins_min_slice", DEFAULT_MIN_SLICE)
        )
        use_limits = bool(self.setting(snapshot, self.use_limits, "gittins_use_limits", True))
        dist = self._distribution(snapshot.service_distribution)
        ratios = self._ratio_distribution(snapshot.limit_ratio_distribution) if use_limits else None
        model = IndexModel(dist, ratios, use_limits)
        fast = bool(snapshot.settings.get("fast_paths", True))

        def indices_of(jobs: Sequence[Any], ran: bool) -> np.ndarray:
            """`index` of each job (with `ran`, of a running job with this attempt's
            service added), by columns (IndexModel.indices)."""
            n = len(jobs)
            gpus = np.fromiter((j.gpu_equivalent for j in jobs), float, n)
            attained = np.fromiter((j.attained_service for j in jobs), float, n)
            if ran:
                started = np.fromiter((j.started_at for j in jobs), float, n)
                attained += np.maximum(now - started, 0.0) * gpus
            limits = np.fromiter((j.time_limit for j in jobs), float, n)
            return model.indices(attained, limits, gpus)

        running_of = dict(
            zip(
                (r.id for r in snapshot.running),
                indices_of(snapshot.running, ran=True).tolist(),
                strict=True,
            )
        )
        # The queue in order with its indices and tiers: from the rows kept across cycles
        # where the jobs carried over, else from the snapshot's jobs.
        queue: RankedQueue | None = None
        row_tiers = None
        if fast and self._rows.sync(snapshot.pending, snapshot.pending_changes):
            row_tiers = self.row_tiers(snapshot)
            if row_tiers is None:
                queue = self._rows.queue(model, None, None)
            else:
                queue = self._rows.queue(model, row_tiers[0], row_tiers[1])
        rest: QueueRest | None = None
        tier_columns: tuple[np.ndarray, np.ndarray] | None = None
        queue_left: Callable[[np.ndarray], np.ndarray] | None
        if queue is not None:
            pending_index: Mapping[int, float] = queue.index_of
            tiers: Tiers | None = None
            if row_tiers is not None:
                assert queue.tiers is not None
                tiers = (queue.tiers, row_tiers[2])
                tier_columns = queue.tier_columns
            order, rest, queue_index = queue.jobs, queue.rest, queue.index
            queue_left = queue.remaining
        else:
            # In snapshot order, and by job id.
            indices = indices_of(snapshot.pending, ran=False)
            pending_index = dict(
                zip((j.id for j in snapshot.pending), indices.tolist(), strict=True)
            )
            tiers = self.tiers(snapshot, lambda j: pending_index[j.id])
            if tiers is None:
                order, ranked = queue_order(snapshot, (-indices,))
            else:
                keys = (*self.tier_columns(snapshot, tiers[0]), -indices)
                order, ranked = queue_order(snapshot, keys)
            queue_index = indices[ranked]
            queue_left = lambda rows: pending_remaining(snapshot.pending)[ranked[rows]]  # noqa: E731

        remaining = model.remaining
        costs = PreemptionCost.from_settings(snapshot.settings)
        check_gain = bool(snapshot.settings.get("preemption_gain_check", True))
        pending_left: dict[int, float] = {}

        # Per victim: expected GPU-seconds still to come, the weighted preemption cost and
        # the progress a preemption throws away. A cycle asks about every pair of a waiting
        # job that does not fit and a running job, so the rule compares numbers and words a
        # reason only for a victim it allows.
        victim_left: dict[int, tuple[float, float, float]] = {}
        weight, bound = costs.cost_weight, costs.loss_bound or math.inf  # 0: no bound

        def job_left(job: PendingJob) -> float:
            left = pending_left.get(job.id)
            if left is None:
                left = pending_left[job.id] = remaining(
                    job.attained_service, job.time_limit, job.gpu_equivalent
                )
            return left

        def victim_known(victim: RunningJob) -> tuple[float, float, float]:
            known = victim_left.get(victim.id)
            if known is None:
                ran = max(now - victim.started_at, 0.0) * victim.gpu_equivalent
                known = victim_left[victim.id] = (
                    remaining(
                        victim.attained_service + ran, victim.time_limit, victim.gpu_equivalent
                    ),
                    weight * costs.gpu_seconds(victim, now),
                    costs.lost_gpu_seconds(victim, now),
                )
            return known

        def victim_rule(job: PendingJob, victim: RunningJob) -> Reason | None:
            if now - victim.started_at < min_slice:
                return None
            mine, theirs = pending_index[job.id], running_of[victim.id]
            if mine <= theirs * (1.0 + margin):
                return None
            if tiers is not None and tiers[1][victim.id] < tiers[0][job.id]:
                return None  # its tier goes first
            left = other = 0.0
            if check_gain:
                left = job_left(job)
                other, cost, lost = victim_known(victim)
                if not left + cost < other or lost > bound * left:
                    return None

            def write() -> str:
                pays = f"; {costs.pays(left, other, victim, now)}" if check_gain else ""
                return (
                    f"Gittins index {_fmt(mine)} beats {_fmt(theirs)} by more than "
                    f"{margin:g}x{pays}"
                )

            return Reason(write)

        # The rule's numeric tests over all victims at once (numpy, the same float
        # operations), so a long queue does not ask the rule about every pair: a waiting
        # job that does not fit is weighed against thousands of running jobs.
        columns: dict[str, Any] = {}

        def victim_columns(victims: list[RunningJob]) -> dict[str, Any]:
            if columns.get("of") is not victims:
                started = np.fromiter((v.started_at for v in victims), float, len(victims))
                theirs = np.fromiter((running_of[v.id] for v in victims), float, len(victims))
                columns.update(
                    of=victims,
                    young=(now - started) < min_slice,
                    bound=theirs * (1.0 + margin),
                )
                if check_gain:
                    # victim_known's numbers, by columns (the same float operations).
                    n = len(victims)
                    gpus = np.fromiter((v.gpu_equivalent for v in victims), float, n)
                    attained = np.fromiter((v.attained_service for v in victims), float, n)
                    attained += np.maximum(now - started, 0.0) * gpus
                    limits = np.fromiter((v.time_limit for v in victims), float, n)
                    # victim_known's remaining service up to rounding: the filter's test
                    # allows for it (`slack`), and the rule decides each victim it lists.
                    other = model.remainings_near(attained, limits * gpus)
                    cost, columns["lost"] = costs.columns(victims, now)
                    columns["other"], columns["cost"] = other, weight * cost
                    columns["slack"] = _SLACK * (np.abs(other) + np.abs(columns["cost"]))
            return columns

        def victim_filter(job: PendingJob, victims: list[RunningJob]) -> Iterable[int]:
            victim_columns(victims)
            keep = ~columns["young"] & ~(pending_index[job.id] <= columns["bound"])
            if check_gain:
                left = job_left(job)
                slack = columns["slack"] + _SLACK * abs(left)
                keep &= (left + columns["cost"]) < columns["other"] + slack
                keep &= ~(columns["lost"] > bound * left)
            return np.flatnonzero(keep).tolist()

        def rule_hint(jobs: Sequence[PendingJob], victims: list[RunningJob]) -> np.ndarray:
            left_of: Callable[[np.ndarray], np.ndarray] | None = None
            job_tiers = None
            if jobs is order:  # the walk's queue: the columns, put in its order
                mine = queue_index
                if check_gain:
                    left_of = queue_left
                job_tiers = tier_columns
            else:
                mine = np.fromiter((pending_index[j.id] for j in jobs), float, len(jobs))
                if check_gain:
                    left_of = lambda rows: np.fromiter(  # noqa: E731
                        (job_left(jobs[k]) for k in rows.tolist()), float, len(rows)
                    )
            return may_allow_any(
                victim_columns(victims), victims, jobs, mine, left_of, bound, tiers, job_tiers
            )

        def pending_remaining(jobs: Sequence[PendingJob]) -> np.ndarray:
            """`job_left` of every job, by columns (IndexModel.remainings)."""
            n = len(jobs)
            attained = np.fromiter((j.attained_service for j in jobs), float, n)
            cap = np.fromiter((j.time_limit for j in jobs), float, n) * np.fromiter(
                (j.gpu_equivalent for j in jobs), float, n
            )
            return model.remainings(attained, cap)

        preempt = bool(snapshot.settings.get("gittins_preemption", True))
        if tiers is None:
            rule_key: Callable[[PendingJob], Any] = lambda j: pending_index[j.id]  # noqa: E731
        else:
            tier = tiers[0]
            rule_key = lambda j: (tier[j.id], pending_index[j.id])  # noqa: E731
        cycle = Cycle(
            snapshot,
            self.name,
            preempt=True,
            victim_rule=victim_rule if preempt else None,
            rule_key=rule_key,
            # settings "fast_paths" false: the rule alone, the reference the filter is
            # tested against.
            victim_filter=victim_filter if fast else None,
            rule_hint=rule_hint if fast else None,
        )
        cycle.consider_all(order, rest)
        notes = (
            () if dist is not None else ("gittins: no size history yet, least attained service",)
        )
        return cycle.plan(notes)


def queue_order(
    snapshot: Snapshot, keys: tuple[np.ndarray, ...]
) -> tuple[list[PendingJob], np.ndarray]:
    """The pending jobs sorted by `keys` (arrays in snapshot order, most significant
    first), then submit time, then id, as sorting by the tuple of them would (a stable
    sort on plain numbers; with NaN among them, that sort itself); and their positions in
    the snapshot."""
    pending = snapshot.pending
    n = len(pending)
    submitted = np.fromiter((j.submitted_at for j in pending), float, n)
    if not all(np.isfinite(k).all() for k in (*keys, submitted)):
        rows = [tuple(k[i].item() for k in keys) for i in range(n)]
        by_tuple = sorted(range(n), key=lambda i: (rows[i], pending[i].submitted_at, pending[i].id))
        return [pending[i] for i in by_tuple], np.array(by_tuple, np.int64)
    ids = np.fromiter((j.id for j in pending), np.int64, n)
    ranked = np.lexsort((ids, submitted, *reversed(keys)))
    return [pending[i] for i in ranked.tolist()], ranked


def _fmt(value: float) -> str:
    """An index (1 / GPU-seconds) as the GPU-hours it stands for: '1/2.5 GPU-h'."""
    if value <= 0:
        return "0"
    return f"1/{1.0 / value / 3600:.3g} GPU-h"
