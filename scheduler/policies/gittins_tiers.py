"""Gittins index inside priority and quota tiers: fleet's default policy."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from scheduler.core.model import PendingJob, Snapshot
from scheduler.core.preemption_cost import QOS_RANKS_DEFAULT
from scheduler.policies.gittins import GittinsPolicy, Tiers, queue_order
from scheduler.policies.gittins_rows import PointsRule, QuotaInputs
from scheduler.policies.gittins_running import RunningTiers
from scheduler.policies.priority import setting

_EPS = 1e-9
WITHIN, BEYOND = 0, 1  # quota tiers: within the team's guarantee, and beyond it


def _points_weights(snapshot: Snapshot) -> tuple[Mapping[str, int], int, float, float, int]:
    """QoS ranks, the top rank, the QoS and job priority weights, the default rank."""
    s = snapshot.settings
    ranks = s.get("qos_ranks") or QOS_RANKS_DEFAULT
    top = max(max(ranks.values()), 1)
    w_qos = float(setting(s, "priority_weight_qos"))
    w_job = float(setting(s, "priority_weight_job"))
    return ranks, top, w_qos, w_job, ranks.get("normal", 0)


def points_rule(snapshot: Snapshot) -> PointsRule:
    """`priority_points` in parts, for columns: the QoS part per QoS (the points are it
    plus the job priority's weight times the priority), and what they depend on."""
    ranks, top, w_qos, w_job, default = _points_weights(snapshot)

    def qos_part(qos: str) -> float:
        return w_qos * ranks.get(qos, default) / top

    return PointsRule(qos_part, w_job, (tuple(ranks.items()), w_qos, w_job))


def _rule_key(snapshot: Snapshot) -> str | None:
    """What `priority_points` depends on, as a string that tells apart any two rules that
    may give different points (repr tells 0 from 0.0 and -0.0); None with a NaN among them,
    whose bits repr does not tell."""
    ranks, top, w_qos, w_job, default = _points_weights(snapshot)
    numbers = (top, w_qos, w_job, default, *ranks.values())
    if any(isinstance(x, float) and x != x for x in numbers):
        return None
    return repr((tuple(ranks.items()), w_qos, w_job))


def priority_points(snapshot: Snapshot) -> Callable[[Any], float]:
    """A job's priority tier in the priority policy's points: QoS rank over the top rank
    times "priority_weight_qos" (default 1000), plus the job's priority (nice) times
    "priority_weight_job" (default 1). Higher goes first."""
    ranks, top, w_qos, w_job, default = _points_weights(snapshot)

    def points(job: Any) -> float:
        return w_qos * ranks.get(job.qos, default) / top + w_job * job.priority

    return points


def _quota_tiers(
    snapshot: Snapshot, jobs: Iterable[Any], start: dict[str, float]
) -> dict[int, int]:
    """Per job, WITHIN while its team's GPU use (from `start`) plus the job stays within the
    team's guarantee, taking the jobs in the order given; BEYOND otherwise (every job of a
    team without a guarantee)."""
    used = dict(start)
    out: dict[int, int] = {}
    for job in jobs:
        team = snapshot.teams.get(job.team)
        guarantee = team.guaranteed_gpus if team is not None else 0
        amount = job.gpu_equivalent
        mine = used.get(job.team, 0.0)
        if guarantee > 0 and mine + amount <= guarantee + _EPS:
            out[job.id] = WITHIN
            used[job.team] = mine + amount
        else:
            out[job.id] = BEYOND
    return out


class GittinsTiersPolicy(GittinsPolicy):
    """Jobs go by priority tier, then quota tier, then Gittins index (`gittins`, with its
    settings) inside a tier.

    - Priority tier: QoS and job priority as the `priority` policy weighs them
      (`priority_points`: settings "qos_ranks", "priority_weight_qos", "priority_weight_job");
      a higher tier goes first whatever the index. Age, fair share and size, which the
      priority policy adds, are left to the index and the quota tier.
    - Quota tier: jobs that keep their team within its guaranteed GPUs (counting what the
      team runs now, then its waiting jobs in this order) go before jobs that would borrow
      beyond it, so a team over its guarantee does not jump one within it. Hard limits and
      per-user caps hold jobs back as in every policy.

    Preemption is gittins': a waiting job may preempt a running one whose index it beats
    by the margin, when that pays for the preemption's cost, with the per-job cap; but
    never a running job of a tier that goes before its own (a running job's quota tier
    counts its team's running jobs by start time). A team within its guarantee still
    reclaims GPUs from borrowers (settings "preemption") and a higher QoS preempts a lower
    one where "qos_preemption" is on, as in every policy. With every job in one tier (no
    priorities, QoS or guarantees) the plan is gittins' own.

    Trade-off: what admins set (QoS, priorities, guarantees) is kept strictly, and inside
    those lines short jobs finish first without runtime estimates; a high tier with long
    jobs holds back the short jobs of lower tiers, as a strict priority does.
    """

    name = "gittins-tiers"

    def __init__(self, *args: Any, **params: Any) -> None:
        super().__init__(*args, **params)
        self._running = RunningTiers()

    def _running_tiers(
        self, snapshot: Snapshot, points: Callable[[Any], float]
    ) -> tuple[dict[int, Any], dict[str, float]]:
        """The running jobs' tiers (their quota tiers counting each team's running jobs by
        start time), and the GPUs each team runs: kept across cycles by job object
        (scheduler.policies.gittins_running) unless settings "fast_paths" is off."""
        if snapshot.settings.get("fast_paths", True):
            guarantees = {t: team.guaranteed_gpus for t, team in snapshot.teams.items()}
            rule = _rule_key(snapshot)
            kept = self._running.tiers(snapshot.running, points, rule, guarantees)
            if kept is not None:
                return kept
        running_points = {r.id: points(r) for r in snapshot.running}
        running_quota = _quota_tiers(
            snapshot, sorted(snapshot.running, key=lambda r: (r.started_at, r.id)), {}
        )
        usage: dict[str, float] = {}
        for r in snapshot.running:
            usage[r.team] = usage.get(r.team, 0.0) + r.gpu_equivalent
        running = {r.id: (-running_points[r.id], running_quota[r.id]) for r in snapshot.running}
        return running, usage

    def tiers(self, snapshot: Snapshot, index: Callable[[PendingJob], float]) -> Tiers:
        points = priority_points(snapshot)
        pending_points = {j.id: points(j) for j in snapshot.pending}
        running, usage = self._running_tiers(snapshot, points)
        n = len(snapshot.pending)
        points_col = np.fromiter(pending_points.values(), float, n)
        index_col = np.fromiter((index(j) for j in snapshot.pending), float, n)
        ranked, _ = queue_order(snapshot, (-points_col, -index_col))
        pending_quota = _quota_tiers(snapshot, ranked, usage)
        pending = {j.id: (-pending_points[j.id], pending_quota[j.id]) for j in snapshot.pending}
        return pending, running

    def row_tiers(self, snapshot: Snapshot) -> tuple[PointsRule, QuotaInputs, dict[int, Any]]:
        rule = points_rule(snapshot)
        running, usage = self._running_tiers(snapshot, priority_points(snapshot))
        guarantees = {t: team.guaranteed_gpus for t, team in snapshot.teams.items()}
        return rule, QuotaInputs(usage, guarantees), running

    def tier_columns(self, snapshot: Snapshot, tier: Mapping[int, Any]) -> tuple[np.ndarray, ...]:
        n = len(snapshot.pending)
        points = np.fromiter((tier[j.id][0] for j in snapshot.pending), float, n)
        quota = np.fromiter((tier[j.id][1] for j in snapshot.pending), float, n)
        return points, quota
