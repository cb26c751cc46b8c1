"""Where a placement raises fragmentation least: one node per (kind, free count) bucket
and a few GPUs per (kind, free compute) bucket, as best fit looks."""

from __future__ import annotations

from collections import Counter
from itertools import islice

from scheduler.core._capacity_index import Kind, _KindIndex, _Node
from scheduler.core.fragmentation.demand import Demand
from scheduler.core.fragmentation.params import BUCKET_SCAN, ENTRY_SCAN, HOST_SCAN, MEMORY_SCAN
from scheduler.core.fragmentation.scorer import Scorer
from scheduler.core.model import FULL_COMPUTE


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
