"""Multifactor priority, after Slurm's priority/multifactor plugin.

score = w_age * age + w_fairshare * fairshare + w_team * team + w_qos * qos
        + w_size * size + w_job * job.priority

Each factor except the last lies in [0, 1]:

- age: time waited, capped at `priority_max_age` seconds (default 7 days), over that cap;
- fairshare: 2 ** (-U / S), with U the team's share of all decayed usage and S its share
  of all fair-share weights (1 for a team that used nothing, 0.5 at exactly its share);
- team: the team's priority weight over the largest team priority weight;
- qos: the QoS rank (settings "qos_ranks", default low 0, normal 1, high 2) over the top
  rank;
- size: GPU equivalents over the largest node's GPU count; with
  `priority_favor_small` it is one minus that;
- job.priority is added as is, times `priority_weight_job` (a nice value in points).

Settings keys and defaults: priority_weight_age 1000, priority_weight_fairshare 1000,
priority_weight_team 1000, priority_weight_qos 1000, priority_weight_size 100,
priority_weight_job 1, priority_max_age 604800, priority_favor_small False,
priority_reservation True, priority_reservation_after 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from scheduler.core.model import FULL_COMPUTE, PendingJob, Plan, Snapshot
from scheduler.core.preemption_cost import QOS_RANKS_DEFAULT
from scheduler.policies.base import Cycle, cycle_may_preempt
from scheduler.policies.cycle_parts import QueueRest
from scheduler.policies.priority_rows import QueueRows

DEFAULTS: Mapping[str, Any] = {
    "priority_weight_age": 1000.0,
    "priority_weight_fairshare": 1000.0,
    "priority_weight_team": 1000.0,
    "priority_weight_qos": 1000.0,
    "priority_weight_size": 100.0,
    "priority_weight_job": 1.0,
    "priority_max_age": 7 * 86400.0,
    "priority_favor_small": False,
    "priority_reservation": True,
    "priority_reservation_after": 0.0,
}


def setting(settings: Mapping[str, Any], key: str) -> Any:
    value = settings.get(key)
    return DEFAULTS[key] if value is None else value


def fairshare_factors(
    snapshot: Snapshot, queue_teams: Iterable[str] | None = None
) -> dict[str, float]:
    """2 ** (-usage share / weight share) per team known to the snapshot or the queue
    (`queue_teams`: the teams of the pending jobs, when the caller knows them already).
    Totals are summed in team order, so they depend on the teams, not on set order."""
    queued = {j.team for j in snapshot.pending} if queue_teams is None else queue_teams
    teams = sorted(set(snapshot.teams).union(queued))
    usage = {t: (snapshot.teams[t].decayed_usage if t in snapshot.teams else 0.0) for t in teams}
    weight = {
        t: (snapshot.teams[t].fairshare_weight if t in snapshot.teams else 1.0) for t in teams
    }
    total_usage = sum(usage.values())
    total_weight = sum(w for w in weight.values() if w > 0) or 1.0
    out = {}
    for team in teams:
        share = weight[team] / total_weight
        used = usage[team] / total_usage if total_usage > 0 else 0.0
        out[team] = 2.0 ** (-used / share) if share > 0 else 0.0
    return out


def priority_scores(snapshot: Snapshot) -> dict[int, float]:
    """The multifactor score of every pending job (higher runs first)."""
    s = snapshot.settings
    w_age = float(setting(s, "priority_weight_age"))
    w_fs = float(setting(s, "priority_weight_fairshare"))
    w_team = float(setting(s, "priority_weight_team"))
    w_qos = float(setting(s, "priority_weight_qos"))
    w_size = float(setting(s, "priority_weight_size"))
    w_job = float(setting(s, "priority_weight_job"))
    max_age = max(float(setting(s, "priority_max_age")), 1.0)
    favor_small = bool(setting(s, "priority_favor_small"))
    ranks = s.get("qos_ranks") or QOS_RANKS_DEFAULT
    top_rank = max(max(ranks.values()), 1)
    team_weights = {t: ts.priority_weight for t, ts in snapshot.teams.items()}
    top_team = max([1e-9, *team_weights.values()])
    largest_node = max([1, *(len(n.gpus) for n in snapshot.nodes)])
    fairshare = fairshare_factors(snapshot)
    now = snapshot.now
    # Per team and per QoS the factors are constants; only age, size and nice vary by job.
    team_part = {
        t: w_fs * fs + w_team * team_weights.get(t, 1.0) / top_team for t, fs in fairshare.items()
    }
    default_rank = ranks.get("normal", 0)
    qos_part = {q: w_qos * r / top_rank for q, r in ranks.items()}
    scores = {}
    for job in snapshot.pending:
        age = min(max(now - job.submitted_at, 0.0), max_age) / max_age
        size = min(job.gpu_equivalent / largest_node, 1.0)
        if favor_small:
            size = 1.0 - size
        qos = qos_part.get(job.qos)
        if qos is None:
            qos = w_qos * default_rank / top_rank
        scores[job.id] = (
            w_age * age + team_part[job.team] + qos + w_size * size + w_job * job.priority
        )
    return scores


_GPUS = attrgetter("gpus")


class _Weights:
    """What a snapshot's settings, teams and fleet make of the score's per-job terms."""

    def __init__(self, snapshot: Snapshot, queue_teams: Iterable[str] | None = None) -> None:
        s = snapshot.settings
        self.w_age = float(setting(s, "priority_weight_age"))
        w_fs = float(setting(s, "priority_weight_fairshare"))
        w_team = float(setting(s, "priority_weight_team"))
        w_qos = float(setting(s, "priority_weight_qos"))
        self.w_size = float(setting(s, "priority_weight_size"))
        self.w_job = float(setting(s, "priority_weight_job"))
        self.max_age = max(float(setting(s, "priority_max_age")), 1.0)
        self.favor_small = bool(setting(s, "priority_favor_small"))
        ranks = s.get("qos_ranks") or QOS_RANKS_DEFAULT
        top_rank = max(max(ranks.values()), 1)
        team_weights = {t: ts.priority_weight for t, ts in snapshot.teams.items()}
        top_team = max([1e-9, *team_weights.values()])
        self.largest_node = max(1, max(map(len, map(_GPUS, snapshot.nodes)), default=1))
        self.team_part = {
            t: w_fs * fs + w_team * team_weights.get(t, 1.0) / top_team
            for t, fs in fairshare_factors(snapshot, queue_teams).items()
        }
        self.qos_part = {q: w_qos * r / top_rank for q, r in ranks.items()}
        self.qos_default = w_qos * ranks.get("normal", 0) / top_rank

    def scores(
        self,
        now: float,
        submitted: np.ndarray,
        gpus: np.ndarray,
        compute: np.ndarray,
        teams: np.ndarray,
        qos: np.ndarray,
        nice: np.ndarray,
    ) -> np.ndarray:
        age = np.minimum(np.maximum(now - submitted, 0.0), self.max_age) / self.max_age
        equivalent = np.where(gpus > 0, gpus, compute / FULL_COMPUTE)
        size = np.minimum(equivalent / self.largest_node, 1.0)
        if self.favor_small:
            size = 1.0 - size
        return self.w_age * age + teams + qos + self.w_size * size + self.w_job * nice

    def job_terms_key(self) -> tuple[float, float, int, bool]:
        """What `job_terms` depends on besides the jobs."""
        return self.w_size, self.w_job, self.largest_node, self.favor_small

    def job_terms(
        self, gpus: np.ndarray, compute: np.ndarray, nice: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The size and nice terms of `scores` per job (they do not move with the clock)."""
        equivalent = np.where(gpus > 0, gpus, compute / FULL_COMPUTE)
        size = np.minimum(equivalent / self.largest_node, 1.0)
        if self.favor_small:
            size = 1.0 - size
        return self.w_size * size, self.w_job * nice

    def negated_scores(
        self,
        now: float,
        submitted: np.ndarray,
        teams: np.ndarray,
        qos: np.ndarray,
        size_terms: np.ndarray,
        nice_terms: np.ndarray,
    ) -> np.ndarray:
        """`-scores(...)` bit for bit but for the sign of a zero, from `job_terms`: IEEE
        negation is exact and rounding is symmetric, so ((-a) - t) - q == -((a + t) + q)."""
        age = np.minimum(np.maximum(now - submitted, 0.0), self.max_age)
        age /= self.max_age
        neg = np.multiply(-self.w_age, age, out=age)
        neg -= teams
        neg -= qos
        neg -= size_terms
        neg -= nice_terms
        return neg


def priority_score_array(snapshot: Snapshot) -> np.ndarray:
    """`priority_scores` as an array aligned with `snapshot.pending`, computed with numpy in
    the same order of float operations, so every score is bit-for-bit the same."""
    pending = snapshot.pending
    n = len(pending)
    weights = _Weights(snapshot)
    team_part, qos_part, qos_default = weights.team_part, weights.qos_part, weights.qos_default
    rows = np.array(
        [
            (
                j.submitted_at,
                j.gpus,
                j.gpu_compute_percent or 0,
                team_part[j.team],
                qos_part.get(j.qos, qos_default),
                j.priority,
            )
            for j in pending
        ],
        float,
    ).reshape(n, 6)
    submitted, gpus, compute, teams, qos, nice = rows.T
    return weights.scores(snapshot.now, submitted, gpus, compute, teams, qos, nice)


_ROWS = QueueRows()


def priority_order(snapshot: Snapshot) -> list[PendingJob]:
    """Pending jobs by score (highest first), then submit time, then id."""
    return list(priority_ranked(snapshot)[0])


def priority_ranked(
    snapshot: Snapshot,
) -> tuple[Sequence[PendingJob], QueueRest | None]:
    """`priority_order`, with the queue's needs as the walk reads them where the rows kept
    across cycles have them (then the order is read from the rows as the walk reaches it:
    use it within the cycle)."""
    pending = snapshot.pending
    if not snapshot.settings.get("fast_paths", True):
        scores = priority_scores(snapshot)
        return sorted(pending, key=lambda j: (-scores[j.id], j.submitted_at, j.id)), None
    if _ROWS.sync(pending, snapshot.pending_changes):
        return _ROWS.order(snapshot.now, _Weights(snapshot, _ROWS.queued_teams()))
    n = len(pending)
    ids = np.fromiter([j.id for j in pending], np.int64, n)
    submitted = np.fromiter([j.submitted_at for j in pending], float, n)
    ranked = np.lexsort((ids, submitted, -priority_score_array(snapshot)))
    return [pending[k] for k in ranked.tolist()], None


class PriorityPolicy:
    """Highest multifactor score first; any job that fits starts.

    Trade-off: admins can express what matters (waiting time, fair share, team, QoS, size)
    and the fleet stays busy since smaller jobs fill gaps. That gap-filling could starve a
    large job forever, so by default (settings "priority_reservation") the highest-priority
    job that does not fit, once it has waited "priority_reservation_after" seconds, gets a
    reservation as in backfill, and later jobs may not delay it.
    """

    name = "priority"
    blocking = False

    # For drivers that skip cycles (the simulator): the order moves with the clock (age,
    # decayed usage), so a cycle without news may still decide differently.
    time_dependent = True

    def may_preempt(self, settings: Mapping[str, Any], guarantees: bool) -> bool:
        return cycle_may_preempt(settings, guarantees)

    def __init__(self, **params: object) -> None:
        self.params = params

    def order(self, snapshot: Snapshot) -> list[PendingJob]:
        return priority_order(snapshot)

    def schedule(self, snapshot: Snapshot) -> Plan:
        s = snapshot.settings
        after = float(setting(s, "priority_reservation_after"))
        reserve: Any = False
        if setting(s, "priority_reservation"):
            now = snapshot.now

            def reserve(job: PendingJob) -> bool:
                return now - job.submitted_at >= after

        cycle = Cycle(
            snapshot,
            self.name,
            reserve=reserve,
            reserve_with_predictions=bool(s.get("backfill_use_predictions", False)),
            preempt=bool(s.get("preemption", True)),
        )
        jobs, rest = priority_ranked(snapshot)
        cycle.consider_all(jobs, rest)
        return cycle.plan()
