"""Which waiting jobs the preemptive Gittins rule (scheduler.policies.gittins) could allow
any victim at all, for a whole queue at once, so the walk can pass over the others once
they cannot start."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from scheduler.core.model import PendingJob, RunningJob

# Relative slack on the gain test, far above float rounding: a job is passed over only when
# it fails the test by more than this for every victim.
_SLACK = 1e-9


def may_allow_any(
    columns: dict[str, Any],
    victims: list[RunningJob],
    jobs: Sequence[PendingJob],
    mine: np.ndarray,
    left: Callable[[np.ndarray], np.ndarray] | None,
    loss_bound: float,
    tiers: tuple[Mapping[int, Any], Mapping[int, Any]] | None,
    job_tiers: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Per job of `jobs` (`mine`: their indices; `left`: their expected remaining service
    at the positions given, for the gain check), False only where the rule allows it none
    of `victims`, that is no victim at once old enough (the minimum slice), of a tier at or
    after the job's, with an index bound (`columns["bound"]`) below the job's index and,
    with `left`, remaining service (`columns["other"]`) beyond the job's expected remaining
    service plus the victim's cost. The loss bound (every victim would lose more than
    `loss_bound` times the job's remaining service) is tested apart, over all victims. So
    a job some victim passes is kept. Anything not a plain number (NaN, infinity) keeps
    every job. `job_tiers`: the jobs' tiers (negated points, quota tier) as columns, where
    the caller has them (else they are read from `tiers` by job)."""
    n = len(jobs)
    keep = ~columns["young"]
    if not keep.any():
        return np.zeros(n, bool)
    everyone = np.ones(n, bool)
    bound = columns["bound"][keep]
    if not (np.isfinite(bound).all() and np.isfinite(mine).all()):
        return everyone
    gain = None
    if left is not None:
        other, cost, lost = (columns[k][keep] for k in ("other", "cost", "lost"))
        if not all(np.isfinite(a).all() for a in (other, cost, lost)):
            return everyone
        gain = other - cost
    # Victims by bound: a job may take those before its index's place in that order.
    by_bound = np.argsort(bound, kind="stable")
    bounds = bound[by_bound]
    place = np.searchsorted(bounds, mine, side="left")  # victims with bound < index
    # Per job, the victims its tier allows (all of them without tiers), as a mask over the
    # victims by bound; and, per group of jobs with one such mask, the most gain among the
    # first victims by bound (-inf where none is allowed).
    groups: list[tuple[np.ndarray, np.ndarray]]  # (job positions, allowed victims by bound)
    if tiers is None:
        groups = [(np.arange(n), np.ones(len(bounds), bool))]
    else:
        kept = [v for v, k in zip(victims, keep.tolist(), strict=True) if k]
        of_victim = [tiers[1][v.id] for v in kept]
        if not _plain(of_victim):
            return everyone
        if job_tiers is None:
            of_job = [tiers[0][j.id] for j in jobs]
            if not _plain(of_job):
                return everyone
            kinds = list(dict.fromkeys(of_job))
            code_of = {t: c for c, t in enumerate(kinds)}
            codes = np.fromiter((code_of[t] for t in of_job), np.int64, n)
        else:
            points, quota = job_tiers
            if np.isnan(points).any():
                return everyone
            # A code per distinct (points, quota) pair.
            values, back = np.unique(points, return_inverse=True)
            pair = 2 * back.reshape(-1) + quota
            distinct, codes = np.unique(pair, return_inverse=True)
            codes = codes.reshape(-1)
            kinds = [(values[p // 2].item(), int(p % 2)) for p in distinct.tolist()]
        rank = {t: r for r, t in enumerate(sorted(set(of_victim) | set(kinds)))}
        victim_rank = np.fromiter((rank[of_victim[k]] for k in by_bound.tolist()), np.int64)
        by_code = np.argsort(codes, kind="stable")
        cuts = np.flatnonzero(np.diff(codes[by_code])) + 1
        groups = [
            (at, victim_rank >= rank[kinds[int(codes[at[0]])]])
            for at in np.split(by_code, cuts)
            if len(at)
        ]
    ok = np.zeros(n, bool)
    best = np.full(n, -np.inf)  # the most gain among the victims a job may take
    for at, allowed in groups:
        upto = place[at]
        if gain is None:
            # Whether some allowed victim lies before the job's place.
            count = np.concatenate(([0], np.cumsum(allowed)))
            ok[at] = count[upto] > 0
            continue
        most = np.concatenate(
            ([-np.inf], np.maximum.accumulate(np.where(allowed, gain[by_bound], -np.inf)))
        )
        best[at] = most[upto]
        ok[at] = best[at] > -np.inf
    if left is None or gain is None:
        return ok
    # The expected remaining service only of the jobs still in question.
    rows = np.flatnonzero(ok)
    need = left(rows)
    if not np.isfinite(need).all():
        return everyone
    # The rule: left + cost < other for some victim; passed over only when left is above
    # the best other - cost of the victims it may take by more than rounding could explain.
    slack = _SLACK * (np.abs(other).max() + np.abs(cost).max() + np.abs(need))
    # The rule: lost <= loss_bound x left for some victim (the same float operations).
    ok[rows] = (need <= best[rows] + slack) & ~(lost.min() > loss_bound * need)
    return ok


def _plain(tiers: list[Any]) -> bool:
    """Whether every tier compares as a plain value (no NaN inside), so sorting them
    orders them as the rule's comparisons do."""
    for tier in set(tiers):
        for part in tier if isinstance(tier, tuple) else (tier,):
            if part != part:
                return False
    return True
