"""Rise in a node's fragmentation caused by a placement, memoized per key."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduler.core._capacity_index import Kind, _KindIndex, _Node
from scheduler.core.fragmentation.demand import Demand, normalize
from scheduler.core.fragmentation.params import CONSOLIDATE, PRESSURE_EXPONENT
from scheduler.core.model import FULL_COMPUTE

# The scorer `Scorer.for_demand` made last, and the most memo entries it keeps.
_LAST: list[Scorer] = []
_MEMO_MAX = 1 << 16


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
        # The demand's weights per set of kinds a shape may use, for the kinds they were
        # summed over.
        self._sets: list[tuple[tuple[Kind, ...], float]] | None = None
        self._sets_for: tuple[Kind, ...] = ()

    @classmethod
    def for_demand(cls, demand: Demand) -> Scorer:
        """A scorer for this demand: the last one made here while the demand is the same
        (a simulator's or a cycle's next snapshot mostly has the same mix), so its memos
        carry over; else a new one. What it answers depends on the demand alone."""
        last = _LAST[0] if _LAST else None
        if last is not None:
            normalized = normalize(demand)  # (what a new scorer's `demand` would be)
            if last.demand is normalized or last.demand == normalized:
                if len(last._memo) > _MEMO_MAX:
                    last._memo.clear()
                return last
        found = cls(demand)
        _LAST[:] = [found]
        return found

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
        if self._sets is None or self._sets_for != tuple(supply):
            self._sets_for = tuple(supply)
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
