"""Which waiting jobs the preemptive Gittins rule (scheduler.policies.gittins) could allow
any victim at all, for a whole queue at once, so the walk can pass over the others once
they cannot start."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
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
    index: Callable[[PendingJob], float],
    left: Callable[[PendingJob], float] | None,
    loss_bound: float,
    tiers: tuple[dict[int, Any], dict[int, Any]] | None,
) -> np.ndarray:
    """Per job, False only where the rule allows it none of `victims`: every victim is
    younger than the minimum slice, or no victim of a tier at or after the job's has an
    index bound (`columns["bound"]`) below the job's index, or, with `left` (the gain
    check), the job's expected remaining service plus any victim's cost reaches beyond that
    victim's remaining service, or every victim would lose more than `loss_bound` times it.
    Each test is one the rule makes, taken over all victims at once, so a job any victim
    passes is kept. Anything not a plain number (NaN, infinity) keeps every job."""
    n = len(jobs)
    keep = ~columns["young"]
    if not keep.any():
        return np.zeros(n, bool)
    everyone = np.ones(n, bool)
    bound = columns["bound"][keep]
    mine = np.fromiter((index(j) for j in jobs), float, n)
    if not (np.isfinite(bound).all() and np.isfinite(mine).all()):
        return everyone
    if tiers is None:
        ok = mine > bound.min()
    else:
        kept = [v for v, k in zip(victims, keep.tolist(), strict=True) if k]
        of_victim = [tiers[1][v.id] for v in kept]
        of_job = [tiers[0][j.id] for j in jobs]
        if not _plain(of_victim) or not _plain(of_job):
            return everyone
        order = sorted(range(len(kept)), key=of_victim.__getitem__)
        ranked = [of_victim[k] for k in order]
        # Least bound among the victims from each rank on (the rule allows a victim only
        # if its tier does not go before the job's), +inf past the last.
        least = np.append(np.minimum.accumulate(bound[order][::-1])[::-1], np.inf)
        at = {t: bisect_left(ranked, t) for t in set(of_job)}
        first = np.fromiter(map(at.__getitem__, of_job), np.int64, n)
        ok = mine > least[first]
    if left is None:
        return ok
    other, cost, lost = (columns[k][keep] for k in ("other", "cost", "lost"))
    if not all(np.isfinite(a).all() for a in (other, cost, lost)):
        return everyone
    # The expected remaining service only of the jobs still in question.
    rows = np.flatnonzero(ok)
    need = np.fromiter((left(jobs[k]) for k in rows.tolist()), float, len(rows))
    if not np.isfinite(need).all():
        return everyone
    # The rule: left + cost < other for some victim; passed over only when left is above
    # every victim's other - cost by more than rounding could explain.
    top = (other - cost).max()
    slack = _SLACK * (np.abs(other).max() + np.abs(cost).max() + np.abs(need))
    # The rule: lost <= loss_bound x left for some victim (the same float operations).
    ok[rows] = (need <= top + slack) & ~(lost.min() > loss_bound * need)
    return ok


def _plain(tiers: list[Any]) -> bool:
    """Whether every tier compares as a plain value (no NaN inside), so sorting them
    orders them as the rule's comparisons do."""
    for tier in set(tiers):
        for part in tier if isinstance(tier, tuple) else (tier,):
            if part != part:
                return False
    return True
