"""Runtimes the forecast plays: each job's prediction, or a quantile of the learned spread.

The runtime predictor (`scheduler.core.prediction`) gives each job the mean share of its
time limit it is expected to use, and by default (`"predicted"`) the forecast plays every
job at that mean. Runtimes are skewed, though (most jobs use a small share of their limit,
a few all of it): jobs that started together do not all end together at the mean, most end
well before it and a few long after. The other modes play that spread, from the learned
actual/limit ratios (`Snapshot.limit_ratio_distribution`, equal-mass atoms) scaled so that
their mean is the job's own predicted share, a running job's taken above the share of its
limit it has used (given that it has run this long):

- `"median"`: every job at the median of its distribution;
- `"spread"`: each job at a quantile fixed by its id (the golden-ratio sequence, so that
  consecutive jobs spread evenly over the distribution and a job keeps its quantile from
  one forecast to the next): the jobs' ends are one representative draw of when GPUs free
  up. `estimate(..., samples=k)` plays k such draws, the quantiles shifted by 1/k each,
  and gives each job the median of its k starts.

Which mode a forecast uses follows the active policy (`for_policy`): `"median"` under
gittins and gittins-tiers, `"predicted"` under the others. On the Philly recipe
(`bench/RESULTS.md`, `bench/bench_eta.py --runtimes`) the median made gittins' median error
smaller or equal on all ten windows measured (five offsets, two clusters), while under
priority it helped three windows (both at 40000, 8x8 at 0) and hurt the other seven: there
the mean's lateness happens to offset what the forecast leaves out (a team's fair-share
priority falls as its jobs start, so other teams' jobs overtake), and the median leaves
that bias bare. `"spread"`
(one draw, or the median of five) helped neither consistently. Without learned ratios, a
time limit or a prediction, a job is played at its predicted runtime in every mode.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

MODES = ("predicted", "median", "spread")
# Policies whose forecast plays the median runtime (see above); the others the prediction.
MEDIAN_POLICIES = frozenset({"gittins", "gittins-tiers"})
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def quantile_of(job_id: int, offset: float = 0.0) -> float:
    """The job's fixed quantile in [0, 1): the fractional part of id x golden ratio, shifted
    by `offset`."""
    return (job_id * GOLDEN + offset) % 1.0


def for_policy(policy: Any) -> str:
    """The runtimes mode a forecast under this policy plays."""
    return "median" if getattr(policy, "name", "") in MEDIAN_POLICIES else "predicted"


class Runtimes:
    def __init__(self, ratios: Sequence[float], mode: str = "predicted", offset: float = 0.0):
        if mode not in MODES:
            raise ValueError(f"runtimes must be one of {', '.join(MODES)}")
        self.mode, self.offset = mode, offset
        self.ratios = sorted(min(max(float(r), 0.0), 1.0) for r in ratios)
        self.mean = sum(self.ratios) / len(self.ratios) if self.ratios else 0.0

    def _quantile(self, job: Any) -> float:
        return 0.5 if self.mode == "median" else quantile_of(job.id, self.offset)

    def _scaled(self, job: Any) -> list[float] | None:
        """The ratios scaled to the job's own predicted share of its limit; None where the
        job is played at its prediction."""
        limit = float(job.time_limit)
        if self.mode == "predicted" or not self.ratios or self.mean <= 0 or limit <= 0:
            return None
        if job.predicted_runtime is None:
            return None
        scale = min(float(job.predicted_runtime) / limit, 1.0) / self.mean
        return [min(r * scale, 1.0) for r in self.ratios]

    def runtime(self, job: Any) -> float:
        """Seconds a waiting job is played to run once started."""
        scaled = self._scaled(job)
        if scaled is None:
            return float(job.expected_runtime)
        return _pick(scaled, self._quantile(job)) * float(job.time_limit)

    def end(self, job: Any, now: float) -> float | None:
        """When a running job is played to end (never before now); None: at its prediction
        (the caller's rule)."""
        scaled = self._scaled(job)
        if scaled is None:
            return None
        limit = float(job.time_limit)
        used = max(now - float(job.started_at), 0.0) / limit
        above = scaled[bisect_right(scaled, used) :]
        share = _pick(above, self._quantile(job)) if above else 1.0
        return max(float(job.started_at) + share * limit, now)


def _pick(ordered: list[float], q: float) -> float:
    """The equal-mass atom holding quantile q."""
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]
