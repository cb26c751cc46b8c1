"""Job sizes (GPU-seconds) learned from finished jobs, and the Gittins index over them.

Whoever builds a `Snapshot` summarizes the sizes of recently finished jobs (GPU-seconds:
runtime x GPUs, or x the compute share for a fraction) with `summarize` into a few equal-mass
atoms and passes them as `Snapshot.service_distribution`; policies rebuild a
`ServiceDistribution` from them. Each atom is the mean of an equal share of the sorted
sizes, so the summary keeps the mean (heavy tails included), unlike plain quantiles.

The Gittins index of a job that has attained `a` GPU-seconds (Tiresias, NSDI'19; Aalto et
al.) is the best ratio, over quanta `d`, of the chance to finish within `d` more to the work
expected to spend doing so:

    G(a) = sup_d  P(S - a <= d | S > a) / E[min(S - a, d) | S > a]

With equal-mass atoms the supremum sits at one of the atoms above `a`. A job cannot run past
its time limit, so its distribution is truncated at `cap` (limit x GPUs): atoms above it move
to it. A heavy tail gives an index that falls as service is attained (least attained service);
a job close to its limit gets a high index (it is sure to end soon).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

DEFAULT_POINTS = 64
# Below this many finished jobs the summary is empty and policies fall back to their own rule.
MIN_SAMPLES = 20


def summarize(samples: Iterable[float], points: int = DEFAULT_POINTS) -> tuple[float, ...]:
    """Up to `points` equal-mass atoms: the sorted positive samples cut into `points`
    consecutive groups of (almost) equal count, each replaced by its mean. Fewer than
    `MIN_SAMPLES` samples give ()."""
    return summarize_sorted(sorted(float(s) for s in samples if s > 0 and math.isfinite(s)), points)


def summarize_sorted(values: Sequence[float], points: int = DEFAULT_POINTS) -> tuple[float, ...]:
    """`summarize` for positive values already sorted ascending."""
    n = len(values)
    if n < MIN_SAMPLES:
        return ()
    k = min(points, n)
    atoms = []
    for i in range(k):
        lo, hi = i * n // k, (i + 1) * n // k
        atoms.append(round(sum(values[lo:hi]) / (hi - lo), 3))
    return tuple(atoms)


class ServiceDistribution:
    """Equal-mass atoms of job size (GPU-seconds), sorted; computes Gittins indices."""

    def __init__(self, atoms: Sequence[float]) -> None:
        self.atoms = tuple(sorted(float(a) for a in atoms))
        if not self.atoms:
            raise ValueError("a service distribution needs at least one atom")
        self._cache: dict[tuple[float, float], float] = {}

    def index(self, attained: float, cap: float = math.inf) -> float:
        """The Gittins index (1 / GPU-seconds) after `attained` GPU-seconds, for a job that
        cannot exceed `cap` GPU-seconds. Higher means serve first."""
        attained = max(0.0, attained)
        key = (attained, cap)
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = self._index(attained, cap)
        return value

    def _index(self, a: float, cap: float) -> float:
        if cap <= a:
            # At (or past) its limit: it ends any moment now.
            return 1.0
        rest = [min(s, cap) - a for s in self.atoms if s > a]
        if not rest:
            # Older than anything seen: assume it ends at its limit, or (with no limit) that
            # it needs as much again as it already had.
            return 1.0 / (cap - a) if math.isfinite(cap) else 1.0 / max(a, 1.0)
        # rest is sorted; quantum d = rest[j]: finished = j + 1 atoms, work = sum of the
        # first j + 1 plus d for each atom still running after d.
        best = 0.0
        spent = 0.0
        k = len(rest)
        for j, d in enumerate(rest):
            spent += d
            if j + 1 < k and rest[j + 1] == d:
                continue  # equal atoms: the ratio is taken once all of them are in
            work = spent + (k - j - 1) * d
            if work > 0:
                best = max(best, (j + 1) / work)
        return best


def bucket(attained: float, per_octave: int = 4) -> float:
    """`attained` rounded down to a geometric grid (`per_octave` steps per doubling, 0 below
    60 GPU-seconds), so that indices are shared and computed once per bucket."""
    if attained < 60.0:
        return 0.0
    step = math.floor(math.log2(attained) * per_octave) / per_octave
    return float(2.0**step)
