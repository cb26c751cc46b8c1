"""Fragmentation-aware placement: choose the spot that leaves the most of the expected
future demand able to fit (the approach of "Beware of Fragmentation", USENIX ATC'23).

The demand is a distribution of request shapes (`DemandShape`, with weights summing to 1):
whole GPUs per node, or a fraction of one GPU (compute percent and GPU memory), with the
GPU model and memory they need and the host CPUs and memory they ask of a node. It comes
from the recent request mix: the snapshot's `demand` when the cycle's caller passes one
(a decayed history, see `blend`), else the pending queue and the running jobs.

The fragmentation of a node for one shape is the free GPU capacity on it (in percent of a
GPU) that the shape cannot use: everything free when the shape does not fit on the node at
all; else the free share of the GPUs it cannot take (partly used GPUs for a whole-GPU
shape, GPUs with too little compute or memory left for a fraction, GPUs of a kind it may
not use). A node's fragmentation is the weighted sum over shapes; a placement is scored by
how much it raises it, and the lowest rise wins (ties go to plain best fit's choice).

The rise only depends on a few numbers, which is what keeps a cycle cheap:

- a k-GPU job on a node with c wholly free GPUs of kind K: on (K, c, k);
- a fraction on a partly used GPU: on the GPU's kind and its free compute and memory (the
  rest of the node cancels out);
- a fraction on a wholly free GPU: on (K, c) and the fraction.

So the scores are memoized per key, and a placement looks at one node per (kind, free
count) bucket and a few GPUs per (kind, free compute) bucket, as best fit does. A node that
mixes GPU kinds is scored per kind. Two terms are fleet's own: each kind is weighed by the
shapes that depend on it (`Scorer.pressure`), so a kind that some requests name is kept
for them as it runs short; and a whole-GPU placement pays CONSOLIDATE per GPU it leaves
free on its node, so nodes drain back to whole as jobs end (docs/packing.md). Where nodes report host CPUs and memory, a placement
that leaves a node without the host room some shape needs adds that shape's weight times
the node's remaining free GPUs (an upper bound of what it strands there), and up to
`HOST_SCAN` nodes per bucket are compared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from scheduler.core._capacity_index import Kind, _KindIndex, _Node, host_request, per_node_gpus
from scheduler.core.model import FULL_COMPUTE

# Jobs sampled (evenly over the queue and the running jobs) to estimate the mix.
MAX_SAMPLE = 256
# Shapes kept (the most frequent); the rest are dropped and weights renormalized.
MAX_SHAPES = 128
# Added to a whole-GPU placement's rise per GPU it leaves free on its node (percent of a
# GPU): fuller nodes first unless the rise says clearly otherwise, as best fit does; they
# drain back to whole nodes sooner as jobs end. 0 is plain FGD, which on the Philly replay
# (first 20,000 jobs, priority) raised avg JCT by 22 % against best fit; 30 matched it.
CONSOLIDATE = 30.0
# Weight of one whole GPU mixed into a mix read off the queue: a queue is a small sample,
# and whole-GPU requests always come back.
PRIOR = 0.1
# Distinct free-memory amounts compared per (kind, free compute) bucket of partly used GPUs.
MEMORY_SCAN = 2
# Free-compute buckets of partly used GPUs looked at per kind, tightest first.
BUCKET_SCAN = 3
# Partly used GPUs looked at per (kind, free compute) bucket.
ENTRY_SCAN = 8
# How steeply a kind that a shape depends on is kept for it as it runs short (1 would
# be FGD's own weighting; 3 held every shape placeable longest on bench_packing.py).
PRESSURE_EXPONENT = 3
# Share of the fleet's free capacity booked or freed after which the pressure is
# recomputed.
PRESSURE_STEP = 0.02
# Nodes compared per (kind, free count) bucket when host CPUs and memory count.
HOST_SCAN = 8


@dataclass(frozen=True, slots=True)
class DemandShape:
    """One request shape, per node: `gpus` whole GPUs, or (gpus 0) a fraction of one GPU
    with `compute_percent` and `memory_mb` of GPU memory."""

    gpus: int = 1
    compute_percent: int = FULL_COMPUTE
    memory_mb: int = 0
    gpu_model: str | None = None
    min_gpu_memory_mb: int = 0
    cpus: int = 0
    host_memory_mb: int = 0

    def eligible(self, kind: Kind) -> bool:
        if self.gpu_model is not None and self.gpu_model != kind[0]:
            return False
        return kind[1] >= max(self.min_gpu_memory_mb, 0 if self.gpus else self.memory_mb)


Demand = tuple[tuple[DemandShape, float], ...]

# When nothing is known: one whole GPU (then the score ranks like best fit).
DEFAULT_DEMAND: Demand = ((DemandShape(1), 1.0),)


def shape_of(job: Any) -> DemandShape:
    """The per-node shape of a pending or running job."""
    cpus, ram = host_request(job)
    if job.gpus:
        return DemandShape(
            per_node_gpus(job),
            FULL_COMPUTE,
            0,
            getattr(job, "gpu_model", None),
            getattr(job, "min_gpu_memory_mb", None) or 0,
            cpus,
            ram,
        )
    return DemandShape(
        0,
        max(1, min(FULL_COMPUTE, int(job.gpu_compute_percent or 0))),
        int(job.gpu_memory_mb or 0),
        getattr(job, "gpu_model", None),
        getattr(job, "min_gpu_memory_mb", None) or 0,
        cpus,
        ram,
    )


def normalize(counts: Iterable[tuple[DemandShape, float]]) -> Demand:
    """Merge equal shapes, keep the MAX_SHAPES heaviest, weights summing to 1."""
    merged: dict[DemandShape, float] = {}
    for shape, weight in counts:
        if weight > 0:
            merged[shape] = merged.get(shape, 0.0) + weight
    kept = sorted(merged.items(), key=lambda item: (-item[1], _order(item[0])))[:MAX_SHAPES]
    total = sum(w for _, w in kept)
    if total <= 0:
        return DEFAULT_DEMAND
    return tuple((shape, w / total) for shape, w in kept)


def _order(shape: DemandShape) -> tuple[Any, ...]:
    return (
        shape.gpus,
        shape.compute_percent,
        shape.memory_mb,
        shape.gpu_model or "",
        shape.min_gpu_memory_mb,
        shape.cpus,
        shape.host_memory_mb,
    )


# Shapes of jobs seen lately, by id (with the job, so a reused id is not mistaken): a
# simulator's or a cycle's next snapshot mostly holds the same frozen job objects.
_SHAPES: dict[int, tuple[Any, DemandShape]] = {}
_SHAPES_MAX = 1 << 16


# One object per distinct shape, so a sample is counted by object identity (hashing the
# dataclass for every sampled job was most of what a cycle spent on the demand).
_INTERNED: dict[DemandShape, DemandShape] = {}


def _cached_shape(job: Any) -> DemandShape:
    found = _SHAPES.get(id(job))
    if found is not None and found[0] is job:
        return found[1]
    if len(_SHAPES) >= _SHAPES_MAX:
        _SHAPES.clear()
        _INTERNED.clear()  # equal shapes of two objects are still merged by normalize
    made = shape_of(job)
    shape = _INTERNED.setdefault(made, made)
    _SHAPES[id(job)] = (job, shape)
    return shape


def demand_from_jobs(jobs: Sequence[Any], sample: int = MAX_SAMPLE) -> Demand:
    """The shape mix of these jobs (an even sample of at most `sample` of them)."""
    if not jobs:
        return DEFAULT_DEMAND
    step = max(1, len(jobs) // sample)
    shapes = list(map(_cached_shape, jobs[::step]))
    counts = Counter(map(id, shapes))
    by_id = dict(zip(map(id, shapes), shapes, strict=True))
    return normalize((by_id[key], float(c)) for key, c in counts.items())


def blend(older: Demand, newer: Demand, keep: float) -> Demand:
    """A decayed history: `keep` of the older mix plus the rest of the newer one (keep 0.5
    per cycle halves the weight of what was seen a cycle ago)."""
    keep = min(1.0, max(0.0, keep))
    return normalize([(s, w * keep) for s, w in older] + [(s, w * (1.0 - keep)) for s, w in newer])


_LAST: list[tuple[Any, Any, Demand]] = []


def demand_of_snapshot(snapshot: Any) -> Demand:
    """The snapshot's `demand` when given, else the mix of its pending and running jobs
    with PRIOR of one whole GPU (remembered for the last job lists seen, which a cycle and its ETA forecast share)."""
    given = getattr(snapshot, "demand", ())
    if given:
        return normalize(given)
    pending, running = snapshot.pending, snapshot.running
    if _LAST and _LAST[0][0] is pending and _LAST[0][1] is running:
        return _LAST[0][2]
    mix = demand_from_jobs((*pending, *running))
    found = normalize([*((sh, w * (1 - PRIOR)) for sh, w in mix), (DEFAULT_DEMAND[0][0], PRIOR)])
    _LAST[:] = [(pending, running, found)]
    return found


class _KindTerms:
    """What one GPU kind means to the demand: weights of the shapes that may use it."""

    __slots__ = ("whole", "frac", "other")

    def __init__(self, demand: Demand, kind: Kind) -> None:
        self.whole: list[tuple[int, float]] = []
        self.frac: list[tuple[int, int, float]] = []
        self.other = 0.0  # weight of the shapes that may not use this kind
        for shape, w in demand:
            if not shape.eligible(kind):
                self.other += w
            elif shape.gpus:
                self.whole.append((shape.gpus, w))
            else:
                self.frac.append((shape.compute_percent, shape.memory_mb, w))


class Scorer:
    """Rise in a node's fragmentation (percent of a GPU, weighted by the demand) caused by
    a placement; memoized per key, so a cycle computes each a few times at most."""

    def __init__(self, demand: Demand) -> None:
        self.demand = normalize(demand)
        self._terms: dict[Kind, _KindTerms] = {}
        self._memo: dict[tuple[Any, ...], float] = {}
        self._orders: dict[tuple[Any, ...], list[tuple[float, int]]] = {}
        self.host_shapes = [
            (s.cpus, s.host_memory_mb, w) for s, w in self.demand if s.cpus or s.host_memory_mb
        ]
        self._sets: list[tuple[tuple[Kind, ...], float]] | None = None

    def pressure(self, all_kinds: Iterable[_KindIndex]) -> dict[Kind, float]:
        """Per GPU kind, what a percent of it is worth to the demand: the weights of the
        shapes that may use it, each times (free capacity of the fleet / free capacity
        the shape may use) ** PRESSURE_EXPONENT. With every shape able to use every kind
        this is 1 everywhere and the placement is plain FGD (where using a kind no shape
        else wants is a gain); a kind that only few shapes need is used first, and one
        that some shape needs and that runs short is kept for it, more firmly the shorter
        it runs. FreeCapacity recomputes it when its free capacity has moved by
        PRESSURE_STEP of the total since."""
        supply = {(ki.model, ki.memory_mb): ki.free for ki in all_kinds}
        if self._sets is None:
            sets: dict[tuple[Kind, ...], float] = {}
            for shape, w in self.demand:
                key = tuple(sorted(k for k in supply if shape.eligible(k)))
                sets[key] = sets.get(key, 0.0) + w
            self._sets = list(sets.items())
        total = sum(supply.values())
        out = dict.fromkeys(supply, 0.0)
        for kinds, w in self._sets:
            usable = sum(supply[k] for k in kinds)
            if usable <= 0:
                continue
            for k in kinds:
                out[k] += w * (total / usable) ** PRESSURE_EXPONENT
        return out

    def terms(self, kind: Kind) -> _KindTerms:
        found = self._terms.get(kind)
        if found is None:
            found = self._terms[kind] = _KindTerms(self.demand, kind)
        return found

    def whole_order(self, kind: Kind, k: int, most: int) -> list[tuple[float, int]]:
        """(rise, free count) for k whole GPUs on nodes with k..most free, least rise first
        (ties: fewest free)."""
        key = (3, kind, k, most)
        found = self._orders.get(key)
        if found is None:
            found = self._orders[key] = sorted(
                (self.whole(kind, c, k), c) for c in range(k, most + 1)
            )
        return found

    def fraction_whole_order(
        self, kind: Kind, q: int, m: int, most: int
    ) -> list[tuple[float, int]]:
        """(rise, free count) for a fraction on a wholly free GPU of nodes with 1..most
        free, least rise first."""
        key = (4, kind, q, m, most)
        found = self._orders.get(key)
        if found is None:
            found = self._orders[key] = sorted(
                (self.fraction_whole(kind, c, q, m), c) for c in range(1, most + 1)
            )
        return found

    def whole(self, kind: Kind, c: int, k: int) -> float:
        """k whole GPUs taken on a node with c wholly free GPUs of this kind."""
        key = (0, kind, c, k)
        found = self._memo.get(key)
        if found is not None:
            return found
        t = self.terms(kind)
        after = c - k
        rise = 0.0
        for j, w in t.whole:
            if c < j:
                rise -= w * FULL_COMPUTE * k
            elif after < j:
                rise += w * FULL_COMPUTE * after
        # Fractions: the GPUs taken were usable before and are gone after; no change.
        rise += CONSOLIDATE * after
        self._memo[key] = rise = round(rise, 9)
        return rise

    def fraction_partial(self, kind: Kind, v: int, mg: int, q: int, m: int) -> float:
        """A fraction (q %, m MB) on a partly used GPU with v % and mg MB free."""
        key = (1, kind, v, mg, q, m)
        found = self._memo.get(key)
        if found is not None:
            return found
        t = self.terms(kind)
        va, ma = v - q, mg - m
        rise = 0.0
        for _, w in t.whole:
            rise -= w * q
        for qq, mm, w in t.frac:
            before = v if (v < qq or mg < mm) else 0
            after = va if (va < qq or ma < mm) else 0
            rise += w * (after - before)
        self._memo[key] = rise = round(rise, 9)
        return rise

    def fraction_whole(self, kind: Kind, c: int, q: int, m: int) -> float:
        """A fraction (q %, m MB) on a wholly free GPU of a node with c of them."""
        key = (2, kind, c, q, m)
        found = self._memo.get(key)
        if found is not None:
            return found
        t = self.terms(kind)
        left, mem_left = FULL_COMPUTE - q, kind[1] - m
        rise = 0.0
        for j, w in t.whole:
            if c < j:
                rise -= w * q
            elif c - 1 >= j:
                rise += w * left
            else:
                rise += w * (left + FULL_COMPUTE * (c - 1))
        for qq, mm, w in t.frac:
            if left < qq or mem_left < mm:
                rise += w * left
        self._memo[key] = rise = round(rise, 9)
        return rise

    def host_rise(self, node: _Node, cpus: int, ram: int, gpu_left: int) -> float:
        """Weight of the shapes whose host CPUs or memory fit the node before the booking
        and not after, times the node's free GPU share left (what they would strand)."""
        if not (cpus or ram) or not self.host_shapes:
            return 0.0
        free_c, free_r = node.cpus, node.ram
        rise = 0.0
        for sc, sr, w in self.host_shapes:
            fits = (free_c is None or free_c >= sc) and (free_r is None or free_r >= sr)
            if not fits:
                continue
            after_c = None if free_c is None else free_c - cpus
            after_r = None if free_r is None else free_r - ram
            if (after_c is not None and after_c < sc) or (after_r is not None and after_r < sr):
                rise += w * gpu_left
        return rise


def free_share(node: _Node) -> int:
    """Free compute on a schedulable node's GPUs, in percent of a GPU."""
    return sum(c for c, mm in zip(node.comp, node.mem, strict=True) if c > 0 and mm > 0)


def choose_whole(
    scorer: Scorer,
    kinds: list[_KindIndex],
    nodes: list[_Node],
    k: int,
    host: tuple[int, int] | None = None,
    pressure: dict[Kind, float] | None = None,
) -> tuple[_Node, Kind] | None:
    """The node (and GPU kind) where k whole GPUs raise fragmentation least."""
    best: tuple[float, int] | None = None
    pick: tuple[_Node, Kind] | None = None
    memo = scorer._memo
    for ki in kinds:
        kind = (ki.model, ki.memory_mb)
        worth = FULL_COMPUTE * k * pressure[kind] if pressure is not None else 0.0
        if host is None:
            if not ki.bmask >> k:
                continue
            bmask = ki.bmask
            for least, c in scorer.whole_order(kind, k, len(ki.buckets) - 1):
                if (bmask >> c) & 1:
                    key = (least + worth, c)
                    if best is None or key < best:
                        best, pick = key, (nodes[next(iter(ki.buckets[c]))], kind)
                    break
            continue
        mask, c = ki.bmask >> k, k
        while mask:
            if mask & 1:
                rise = memo.get((0, kind, c, k))
                if rise is None:
                    rise = scorer.whole(kind, c, k)
                base = rise + worth
                if host is None:
                    key = (base, c)
                    if best is None or key < best:
                        best, pick = key, (nodes[next(iter(ki.buckets[c]))], kind)
                else:
                    seen = 0
                    for pos in ki.buckets[c]:
                        node = nodes[pos]
                        if not node.host_fits(*host):
                            continue
                        left = free_share(node) - FULL_COMPUTE * k
                        key = (base + scorer.host_rise(node, host[0], host[1], left), c)
                        if best is None or key < best:
                            best, pick = key, (node, kind)
                        seen += 1
                        if seen >= HOST_SCAN:
                            break
            mask >>= 1
            c += 1
    return pick


def choose_fraction(
    scorer: Scorer,
    kinds: list[_KindIndex],
    nodes: list[_Node],
    q: int,
    m: int,
    host: tuple[int, int] | None = None,
    pressure: dict[Kind, float] | None = None,
) -> tuple[_Node, int] | None:
    """The node and GPU position where a fraction (q %, m MB) raises fragmentation least:
    per kind, the first GPU that takes it in each free-compute bucket, and a wholly free
    GPU on one node per free count."""
    best: tuple[float, int, int, int] | None = None
    pick: tuple[_Node, int] | None = None
    start = max(q, 1)
    memo = scorer._memo
    for ki in kinds:
        kind = (ki.model, ki.memory_mb)
        worth = q * pressure[kind] if pressure is not None else 0.0
        mask = ki.pmask >> start
        buckets = 0
        while mask and buckets < BUCKET_SCAN:
            buckets += 1
            low = mask & -mask
            mask ^= low
            v = start + low.bit_length() - 1
            tried: list[int] = []
            for node_pos, p in islice(ki.partial[v], ENTRY_SCAN):
                node = nodes[node_pos]
                mg = node.mem[p]
                if mg < m or mg in tried or (host is not None and not node.host_fits(*host)):
                    continue
                tried.append(mg)
                rise = memo.get((1, kind, v, mg, q, m))
                if rise is None:
                    rise = scorer.fraction_partial(kind, v, mg, q, m)
                score = rise + worth
                if host is not None:
                    score += scorer.host_rise(node, host[0], host[1], free_share(node) - q)
                if best is None or score <= best[0]:
                    key = (score, 0, v, mg)
                    if best is None or key < best:
                        best, pick = key, (node, p)
                if len(tried) >= MEMORY_SCAN:
                    break
        if m > ki.memory_mb:
            continue
        if host is None:
            bmask = ki.bmask
            if not bmask:
                continue
            for least, c in scorer.fraction_whole_order(kind, q, m, len(ki.buckets) - 1):
                if (bmask >> c) & 1:
                    key = (least + worth, 1, c, 0)
                    if best is None or key < best:
                        node = nodes[next(iter(ki.buckets[c]))]
                        best, pick = key, (node, node.whole[kind][0])
                    break
            continue
        mask, c = ki.bmask >> 1, 1
        while mask:
            if mask & 1:
                base = scorer.fraction_whole(kind, c, q, m) + worth
                seen = 0
                for pos in ki.buckets[c]:
                    node = nodes[pos]
                    score = base
                    if host is not None:
                        if not node.host_fits(*host):
                            continue
                        score += scorer.host_rise(node, host[0], host[1], free_share(node) - q)
                    key = (score, 1, c, 0)
                    if best is None or key < best:
                        best, pick = key, (node, node.whole[kind][0])
                    seen += 1
                    if host is None or seen >= HOST_SCAN:
                        break
            mask >>= 1
            c += 1
    return pick


def node_fragmentation(demand: Demand, node: _Node) -> float:
    """Expected free GPU share (percent of a GPU) on a node that a request drawn from the
    demand could not use: the measure the scorer's rises are differences of."""
    if not node.schedulable:
        return 0.0
    total = 0.0
    free = [
        (node.kind_of[p], c, node.mem[p], c >= FULL_COMPUTE and node.mem[p] >= g.memory_mb)
        for p, (g, c) in enumerate(zip(node.gpus, node.comp, strict=True))
        if c > 0 and node.mem[p] > 0
    ]
    all_free = sum(c for _, c, _, _ in free)
    for shape, w in demand:
        if not node.host_fits(shape.cpus, shape.host_memory_mb):
            total += w * all_free
            continue
        if shape.gpus:
            counts: Counter[Kind] = Counter(k for k, _, _, whole in free if whole)
            usable_kinds = [k for k, n in counts.items() if n >= shape.gpus and shape.eligible(k)]
            if not usable_kinds:
                total += w * all_free
                continue
            usable = sum(c for k, c, _, whole in free if whole and k in usable_kinds)
            total += w * (all_free - usable)
        else:
            usable = sum(
                c
                for k, c, mm, _ in free
                if shape.eligible(k) and c >= shape.compute_percent and mm >= shape.memory_mb
            )
            total += w * (all_free - usable)
    return total
