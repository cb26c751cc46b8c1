"""What a preemption costs, and when it pays.

What a preemption costs is `PreemptionCost` (settings "preemption_restart_overhead",
"preemption_checkpoints", "preemption_checkpoint_interval", "preemption_max_per_job"): the
restart overhead plus the progress the victim loses (all of this attempt without
checkpoints, only the time since its last checkpoint with them; `RunningJob.checkpointed`
says which for a job known either way, the settings for the rest), in GPU-seconds; victims are
ranked by that cost, and a job preempted `max_per_job` times is not preempted again. The
policies that preempt for efficiency (las, gittins) preempt only when the gain pays for it:
the waiting job's expected remaining service (`mean_residual`) plus the cost is below the
victim's; gittins also requires that the progress thrown away be at most `loss_bound` times
the waiting job's expected remaining service (`loses_too_much`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.core.model import RunningJob

# Settings key "qos_ranks" overrides these; a higher rank may preempt a lower one when
# settings["qos_preemption"] is true.
QOS_RANKS_DEFAULT = {"low": 0, "normal": 1, "high": 2}


def lost_work(job: RunningJob, now: float) -> float:
    return max(0.0, now - job.started_at) * job.gpu_equivalent


# Defaults of the preemption cost settings (scheduler/cycle/params.py declares them).
RESTART_OVERHEAD_DEFAULT = 60.0  # seconds a restarted job spends before useful work
CHECKPOINT_INTERVAL_DEFAULT = 0.0  # with checkpoints: 0 means continuous (nothing lost)
MAX_PER_JOB_DEFAULT = 10  # preemptions a job may suffer; 0: no cap
# The lost work counts this many times: the victim redoes it, and while it does the fleet
# lacks that capacity for every other waiting job; and the expected remaining service of a
# job deep in a heavy tail is a guess, the lost work is certain. 8 measured best on the
# Philly bench (bench/RESULTS.md, "Preemption that pays for itself").
COST_WEIGHT_DEFAULT = 8.0
# A preemption throws away at most this many times the GPU-seconds the waiting job is
# expected to need (`PreemptionCost.loss_bound`). The exchange argument weighs the lost
# progress against the victim's expected remaining service, which deep in a heavy tail is a
# guess of hundreds of GPU-hours; what the waiting job gains is bounded by its own size and
# wait, and a job of minutes should not cost the fleet hours of redone work. 16 measured
# against none on the Philly bench without checkpoints (bench/RESULTS.md, "Preemption
# without checkpoints"); a job that checkpoints continuously loses nothing and always passes.
LOSS_BOUND_DEFAULT = 16.0


@dataclass(frozen=True, slots=True)
class PreemptionCost:
    """What stopping a running job costs, in GPU-seconds, and whether it may be stopped.

    Cost = (restart overhead + progress lost) x the job's GPUs. Without checkpoints
    (`checkpoints` false, fleet's default: a preempted job restarts from scratch) the
    progress lost is the whole run time of this attempt; with them, the time since the last
    checkpoint, taken every `checkpoint_interval` seconds from the attempt's start (0: the
    job checkpoints continuously and loses nothing). A job that says whether it checkpoints
    (`RunningJob.checkpointed` true or false: production knows it once an attempt of the job
    resumed, or a later one started fresh) is costed so; `checkpoints` decides for the jobs
    that have not said (None). A job already preempted `max_per_job`
    times (0: no cap) is not preempted again, so no job is starved by churn.
    """

    restart_overhead: float = RESTART_OVERHEAD_DEFAULT
    checkpoints: bool = False
    checkpoint_interval: float = CHECKPOINT_INTERVAL_DEFAULT
    max_per_job: int = MAX_PER_JOB_DEFAULT
    cost_weight: float = COST_WEIGHT_DEFAULT
    loss_bound: float = LOSS_BOUND_DEFAULT

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> PreemptionCost:
        def get(key: str, default: Any) -> Any:
            value = settings.get(key)
            return default if value is None else value

        return cls(
            restart_overhead=max(
                0.0, float(get("preemption_restart_overhead", RESTART_OVERHEAD_DEFAULT))
            ),
            checkpoints=bool(get("preemption_checkpoints", False)),
            checkpoint_interval=max(
                0.0, float(get("preemption_checkpoint_interval", CHECKPOINT_INTERVAL_DEFAULT))
            ),
            max_per_job=max(0, int(get("preemption_max_per_job", MAX_PER_JOB_DEFAULT))),
            cost_weight=max(0.0, float(get("preemption_cost_weight", COST_WEIGHT_DEFAULT))),
            loss_bound=max(0.0, float(get("preemption_loss_bound", LOSS_BOUND_DEFAULT))),
        )

    def keeps_checkpoints(self, job: RunningJob) -> bool:
        """Whether the job resumes from a checkpoint: its own word, else the setting."""
        known = getattr(job, "checkpointed", None)
        return self.checkpoints if known is None else bool(known)

    def lost_seconds(self, job: RunningJob, now: float) -> float:
        """Seconds of this attempt's progress a preemption now would throw away."""
        ran = max(0.0, now - job.started_at)
        if not self.keeps_checkpoints(job):
            return ran
        if self.checkpoint_interval <= 0:
            return 0.0
        return ran % self.checkpoint_interval

    def lost_gpu_seconds(self, job: RunningJob, now: float) -> float:
        """GPU-seconds of this attempt's progress a preemption now would throw away."""
        return self.lost_seconds(job, now) * job.gpu_equivalent

    def loses_too_much(self, job: RunningJob, now: float, waiting_remaining: float) -> bool:
        """Whether preempting `job` would throw away more than `loss_bound` times the
        GPU-seconds the waiting job is expected to need (`waiting_remaining`); never with
        `loss_bound` 0 (no bound)."""
        if not self.loss_bound:
            return False
        return self.lost_gpu_seconds(job, now) > self.loss_bound * waiting_remaining

    def seconds(self, job: RunningJob, now: float) -> float:
        return self.restart_overhead + self.lost_seconds(job, now)

    def gpu_seconds(self, job: RunningJob, now: float) -> float:
        return self.seconds(job, now) * job.gpu_equivalent

    def columns(self, jobs: Sequence[RunningJob], now: float) -> tuple[np.ndarray, np.ndarray]:
        """`gpu_seconds` and `lost_gpu_seconds` of each job, as arrays: the same float
        operations, one numpy pass instead of a call per job."""
        n = len(jobs)
        ran = np.maximum(now - np.fromiter((j.started_at for j in jobs), float, n), 0.0)
        gpus = np.fromiter((j.gpu_equivalent for j in jobs), float, n)
        keeps = np.fromiter((self.keeps_checkpoints(j) for j in jobs), bool, n)
        if self.checkpoint_interval <= 0:
            since = np.zeros(n)
        else:
            since = np.remainder(ran, self.checkpoint_interval)  # Python's % on floats
        lost = np.where(keeps, since, ran)
        return (self.restart_overhead + lost) * gpus, lost * gpus

    def capped(self, job: Any) -> bool:
        """Whether the job has been preempted as often as allowed."""
        return self.max_per_job > 0 and getattr(job, "preemptions", 0) >= self.max_per_job

    def gain_pays(
        self, waiting_remaining: float, victim_remaining: float, victim: RunningJob, now: float
    ) -> bool:
        """Whether `pays` gives a reason (the test alone, with no text written)."""
        cost = self.gpu_seconds(victim, now)
        return waiting_remaining + self.cost_weight * cost < victim_remaining

    def pays(
        self, waiting_remaining: float, victim_remaining: float, victim: RunningJob, now: float
    ) -> str | None:
        """Why preempting `victim` for a job expected to need `waiting_remaining` more
        GPU-seconds pays (the victim is expected to need `victim_remaining`), or None.

        The exchange argument behind SRPT and Gittins: running the smaller remainder first
        saves the difference, and the preemption throws away its cost; it pays when the
        difference is larger than the cost, counted `cost_weight` times (the victim redoes
        the work, and meanwhile that capacity is missing for everyone else). gittins
        also asks `loses_too_much`."""
        if self.gain_pays(waiting_remaining, victim_remaining, victim, now):
            cost = self.gpu_seconds(victim, now)
            times = "" if self.cost_weight == 1 else f"{self.cost_weight:g} x "
            return (
                f"expected to need {gpu_hours(victim_remaining)} more against "
                f"{gpu_hours(waiting_remaining)}, which beats {times}the preemption's cost of "
                f"{gpu_hours(cost)} ({self.explain(victim, now)})"
            )
        return None

    def explain(self, job: RunningJob, now: float) -> str:
        lost = self.lost_seconds(job, now)
        if not self.keeps_checkpoints(job):
            what = f"{_secs(lost)} of progress without a checkpoint"
        elif lost <= 0:
            what = "nothing lost past its checkpoint"
        else:
            what = f"{_secs(lost)} since its last checkpoint"
        return f"{_secs(self.restart_overhead)} restart + {what}"


def gpu_hours(gpu_seconds: float) -> str:
    return f"{gpu_seconds / 3600:.3g} GPU-h"


def _secs(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def mean_residual(atoms: Sequence[float], attained: float, cap: float = math.inf) -> float:
    """Expected GPU-seconds still to come for a job that has attained `attained`, when job
    sizes follow the equal-mass `atoms` (sorted) and the job cannot exceed `cap`:
    E[min(S, cap) - a | S > a]. With no atom above `attained` (older than anything seen), or
    no atoms at all, it is `attained` again, capped (a heavy tail's rule of thumb: a job
    is expected to run as long again as it has)."""
    a = max(0.0, attained)
    if cap <= a:
        return 0.0
    n = len(atoms)
    lo = bisect_right(atoms, a)  # atoms[lo:] are above the attained service
    if lo == n:
        return min(a, cap - a)
    hi = max(bisect_left(atoms, cap), lo)  # atoms[hi:] reach the cap: each adds cap - a
    # Added from the largest atom down, one by one, as min(s, cap) - a would be: the same
    # floats in the same order (a sum() or numpy's pairwise sum rounds differently).
    total = 0.0
    over = cap - a
    for _ in range(n - hi):
        total += over
    for s in reversed(atoms[lo:hi]):
        total += s - a
    return total / (n - lo)


def mean_residuals(atoms: Sequence[float], attained: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """`mean_residual` of each (attained, cap) pair at once, equal to it up to rounding:
    the atoms are summed in extended precision from prefix sums, not one by one, so a
    value may differ from the scalar one in its last bits. For tests that must let through
    every job the scalar rule would allow (compare with a slack), never for the rule."""
    a = np.maximum(np.asarray(attained, float), 0.0)
    cap = np.asarray(cap, float)
    sizes = np.asarray(atoms, float)
    n = len(sizes)
    out = np.zeros(len(a))
    live = cap > a  # else nothing is left: 0
    if n == 0:
        out[live] = np.minimum(a, cap - a)[live]
        return out
    lo = np.searchsorted(sizes, a, side="right")
    hi = np.maximum(np.searchsorted(sizes, cap, side="left"), lo)
    # above[k]: the sum of sizes[k:], in extended precision.
    above = np.zeros(n + 1, np.longdouble)
    above[:n] = np.cumsum(sizes[::-1].astype(np.longdouble))[::-1]
    older = live & (lo == n)  # no atom above the attained service
    out[older] = np.minimum(a, cap - a)[older]
    rest = live & (lo < n)
    lo_r, hi_r, a_r = lo[rest], hi[rest], a[rest].astype(np.longdouble)
    total = (above[lo_r] - above[hi_r]) - a_r * (hi_r - lo_r)
    capped = n - hi_r > 0  # atoms at or past the cap, each adding cap - a
    total[capped] += (n - hi_r[capped]) * (cap[rest][capped].astype(np.longdouble) - a_r[capped])
    out[rest] = (total / (n - lo_r)).astype(float)
    return out


def qos_rank(qos: str, settings: Any) -> int:
    ranks = settings.get("qos_ranks") or QOS_RANKS_DEFAULT
    return int(ranks.get(qos, ranks.get("normal", 0)))
