"""The Gittins policies' per-job numbers by columns (scheduler.policies.gittins): the index,
the expected remaining service and the quota tiers, with the same float operations as
job by job, so that every value is bit for bit the scalar one."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from scheduler.core.preemption_cost import mean_residual, mean_residuals
from scheduler.core.service_distribution import ServiceDistribution, bucket

RATIO_STEPS = 64  # attained / (limit x GPUs) is rounded down to 1/64ths

_EPS = 1e-9  # as scheduler.core.quota
# Restarts of the scan of one team's jobs (`quota_within`) before the rest of them is
# taken job by job: each restart follows a job that borrowed beyond the guarantee.
_SCAN_ROUNDS = 16


@dataclass(frozen=True, eq=False)
class IndexModel:
    """What a job's Gittins index depends on besides its own numbers: the size
    distribution (`dist`), the limit-ratio distribution (`ratios`, None where limits are
    ignored) and whether limits cut the size distribution."""

    dist: ServiceDistribution | None
    ratios: ServiceDistribution | None
    use_limits: bool

    def same_as(self, other: IndexModel | None) -> bool:
        return (
            other is not None
            and other.dist is self.dist
            and other.ratios is self.ratios
            and other.use_limits == self.use_limits
        )

    def index(self, attained: float, limit: float, gpus: float) -> float:
        """The index of one job (GPU-seconds attained, time limit, GPU equivalent)."""
        cap = limit * gpus
        ratios = self.ratios
        if ratios is not None and cap > 0:
            # Size = cap x ratio: the index scales as 1 / cap.
            if attained >= cap:
                return 1.0  # at its limit: it ends any moment now
            return ratios.index(math.floor(attained / cap * RATIO_STEPS) / RATIO_STEPS) / cap
        a = bucket(attained)
        if self.dist is None:
            return 1.0 / (a + 1.0)
        return self.dist.index(a, cap if self.use_limits and cap > 0 else math.inf)

    def remaining(self, attained: float, limit: float, gpus: float) -> float:
        """Expected GPU-seconds still to come, from the distribution the index uses."""
        cap = limit * gpus
        if self.ratios is not None and cap > 0:
            return cap * mean_residual(self.ratios.atoms, attained / cap, 1.0)
        atoms = self.dist.atoms if self.dist is not None else ()
        return mean_residual(atoms, attained, cap if self.use_limits and cap > 0 else math.inf)

    def indices(
        self,
        attained: np.ndarray,
        limits: np.ndarray,
        gpus: np.ndarray,
        buckets: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> np.ndarray:
        """`index` of every job: the distributions are asked once per distinct step,
        bucket or (bucket, cut) pair, the rest are the same float operations by columns;
        a job with an attained service that is not a plain number goes job by job.
        `buckets`: `bucket` of the attained services at the positions given, where the
        caller keeps them."""
        n = len(attained)
        cap = limits * gpus
        out = np.empty(n)
        finite = np.isfinite(attained)
        ratios = self.ratios
        by_ratio = finite & (cap > 0) if ratios is not None else np.zeros(n, bool)
        at = np.flatnonzero(by_ratio)
        if len(at):
            assert ratios is not None
            a, c = attained[at], cap[at]
            full = a >= c
            steps = np.where(full, 0.0, np.floor(a / c * RATIO_STEPS))
            kinds, back = np.unique(steps, return_inverse=True)
            table = np.array([ratios.index(k / RATIO_STEPS) for k in kinds.tolist()], float)
            out[at] = np.where(full, 1.0, table[back.reshape(-1)] / c)
        at = np.flatnonzero(finite & ~by_ratio)
        if len(at):
            if buckets is not None:
                b = buckets(at)
            else:
                b = np.fromiter(map(bucket, attained[at].tolist()), float, len(at))
            if self.dist is None:
                out[at] = 1.0 / (b + 1.0)
            else:
                c = cap[at]
                cut = np.where(c > 0, c, np.inf) if self.use_limits else np.full(len(at), np.inf)
                both = np.empty(len(at), complex)
                both.real, both.imag = b, cut
                pairs, back = np.unique(both, return_inverse=True)
                dist = self.dist
                table = np.array([dist.index(p.real, p.imag) for p in pairs.tolist()], float)
                out[at] = table[back.reshape(-1)]
        at = np.flatnonzero(~finite)
        for k in at.tolist():
            out[k] = self.index(float(attained[k]), float(limits[k]), float(gpus[k]))
        return out

    def remainings_near(self, attained: np.ndarray, cap: np.ndarray) -> np.ndarray:
        """`remainings` up to rounding (`mean_residuals`), with no call per job: for the
        victim filter's test, which allows a slack and which the rule confirms."""
        n = len(attained)
        ratios = self.ratios
        plain = self.dist.atoms if self.dist is not None else ()
        if ratios is not None:
            share = cap > 0
            scale = np.where(share, cap, 1.0)
            out = np.where(
                share,
                scale * mean_residuals(ratios.atoms, attained / scale, np.ones(n)),
                mean_residuals(plain, attained, np.full(n, np.inf)),
            )
        else:
            cut = np.where(cap > 0, cap, np.inf) if self.use_limits else np.full(n, np.inf)
            out = mean_residuals(plain, attained, cut)
        # Anything not a plain number is asked job by job.
        for k in np.flatnonzero(~(np.isfinite(attained) & np.isfinite(cap))).tolist():
            out[k] = self.remaining(float(attained[k]), float(cap[k]), 1.0)
        return np.asarray(out, float)

    def remainings(self, attained: np.ndarray, cap: np.ndarray) -> np.ndarray:
        """`remaining` of every job (cap: limit x GPUs): the distribution is asked once
        per distinct (attained, cap) pair, and the products are the same float
        operations."""
        n = len(attained)
        ratios = self.ratios
        scale = np.ones(n)
        if ratios is not None:
            share = cap > 0
            scale[share] = cap[share]
            attained = np.where(share, attained / np.where(share, cap, 1.0), attained)
            cut = np.where(share, 1.0, np.inf)
        else:
            cut = np.where(cap > 0, cap, np.inf) if self.use_limits else np.full(n, np.inf)
        # Distinct (attained, cut) pairs as complex numbers (sorted by real part, then
        # imaginary: one fast 1-D unique); a cut of 1.0 goes with the ratio atoms.
        both = np.empty(n, complex)
        both.real, both.imag = attained, cut
        pairs, back = np.unique(both, return_inverse=True)
        plain = self.dist.atoms if self.dist is not None else ()
        each = [
            mean_residual(
                ratios.atoms if ratios is not None and c.imag == 1.0 else plain, c.real, c.imag
            )
            for c in pairs.tolist()
        ]
        return scale * np.array(each, float)[back.reshape(-1)]


def quota_within(
    codes: np.ndarray,
    amounts: np.ndarray,
    names: tuple[str, ...],
    start: Mapping[str, float],
    guarantees: Mapping[str, int],
) -> np.ndarray:
    """Per job, in the order given (`codes`: its team, a code into `names`; `amounts`: its
    GPU equivalent), whether it keeps its team's GPU use (from `start`) within the team's
    guarantee, adding the jobs that do as they come: gittins_tiers' `_quota_tiers`, the
    same float operations (each team's use is summed in order by `np.add.accumulate`)."""
    within = np.zeros(len(codes), bool)
    bounds = {}
    for code, name in enumerate(names):
        guarantee = guarantees.get(name, 0)
        if guarantee > 0:
            bounds[code] = guarantee + _EPS
    if not bounds or not len(codes):
        return within
    small = codes.astype(np.int16) if len(names) < 1 << 15 else codes  # (a radix sort)
    by_team = np.argsort(small, kind="stable")
    grouped = codes[by_team]
    cuts = np.flatnonzero(grouped[1:] != grouped[:-1]) + 1
    for run in np.split(by_team, cuts):
        code = int(codes[run[0]])
        bound = bounds.get(code)
        if bound is not None:
            used = start.get(names[code], 0.0)
            within[run] = _team_within(amounts[run], used, bound)
    return within


def _team_within(amounts: np.ndarray, used: float, bound: float) -> np.ndarray:
    """One team's jobs in order: each is within while use + it <= bound, and adds to use."""
    n = len(amounts)
    out = np.zeros(n, bool)
    pos = 0
    for _ in range(_SCAN_ROUNDS):
        # The next job that fits (use only grows when one does, so the others before it
        # are beyond), then the run of jobs that fit one after another from it.
        fits = used + amounts[pos:] <= bound
        if not fits.any():
            return out
        pos += int(np.argmax(fits))
        acc = np.add.accumulate(np.concatenate(([used], amounts[pos:])))[1:]
        over = ~(acc <= bound)
        run = int(np.argmax(over)) if over.any() else len(acc)
        out[pos : pos + run] = True
        used = float(acc[run - 1])
        pos += run + 1
        if pos >= n:
            return out
    for k in range(pos, n):
        amount = float(amounts[k])
        if used + amount <= bound:
            out[k] = True
            used = used + amount
    return out
