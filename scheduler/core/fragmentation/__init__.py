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

from scheduler.core.fragmentation.choose import (
    choose_fraction,
    choose_whole,
    free_share,
    node_fragmentation,
)
from scheduler.core.fragmentation.demand import (
    DEFAULT_DEMAND,
    Demand,
    DemandShape,
    blend,
    demand_from_jobs,
    demand_of_snapshot,
    normalize,
    shape_of,
)
from scheduler.core.fragmentation.params import (
    BUCKET_SCAN,
    CONSOLIDATE,
    ENTRY_SCAN,
    HOST_SCAN,
    MAX_SAMPLE,
    MAX_SHAPES,
    MEMORY_SCAN,
    PRESSURE_EXPONENT,
    PRESSURE_STEP,
    PRIOR,
)
from scheduler.core.fragmentation.scorer import Scorer

__all__ = [
    "BUCKET_SCAN",
    "CONSOLIDATE",
    "DEFAULT_DEMAND",
    "ENTRY_SCAN",
    "HOST_SCAN",
    "MAX_SAMPLE",
    "MAX_SHAPES",
    "MEMORY_SCAN",
    "PRESSURE_EXPONENT",
    "PRESSURE_STEP",
    "PRIOR",
    "Demand",
    "DemandShape",
    "Scorer",
    "blend",
    "choose_fraction",
    "choose_whole",
    "demand_from_jobs",
    "demand_of_snapshot",
    "free_share",
    "node_fragmentation",
    "normalize",
    "shape_of",
]
