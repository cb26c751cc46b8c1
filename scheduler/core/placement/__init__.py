"""Free capacity of the fleet as a mutable working copy, shared by every policy.

`from_snapshot` places fragmentation-aware by default (scheduler.core.fragmentation,
docs/packing.md): `best_fit` and `best_fit_members` then choose the spot that leaves the
most of the recent request mix able to fit; settings "placement" "best_fit" gives the
plain best fit described below.

`FreeCapacity.from_snapshot(snapshot)` copies what running jobs leave free on each GPU of
each schedulable node; a policy then asks where a job fits (`best_fit`, `candidates`) and
books its choices (`take`), or gives capacity back (`release`) when it simulates jobs
ending. Draining and down nodes are kept, so that releases on them are accounted, but
never offered.

Indexes keep a cycle cheap on large fleets:

- GPUs are grouped by kind, `(model, memory_mb)`. A gang takes GPUs of one kind on one
  node (mixing models inside a data-parallel job makes it run at the slowest GPU's pace).
- Per kind, nodes sit in buckets by their count of wholly free GPUs, with a bit mask of
  non-empty buckets, so "the node with the fewest free GPUs that still holds k" is a
  couple of integer operations.
- Per kind, partly used GPUs sit in buckets by free compute percent (also with a mask),
  so a fraction first looks at the fullest GPUs that still take it.
- A request shape that found nothing is remembered until some capacity is released:
  in a cycle capacity only shrinks, so a second job of the same shape is skipped at once.

Host CPUs and memory are capacity too: a job's `cpus` and `memory_mb` (per node) must fit
what the node has free, and `take`/`release` book them. Nodes that do not report them are
not limited; jobs that ask for none, or a fleet where no node reports them, keep the plain
GPU paths above.

A multi-node gang (`gpus_per_node`) goes through `best_fit_members`, `fits_members`,
`take_members` and `release_members`: every member on its own node, all GPUs of one kind,
placed all at once or not at all. Its nodes come from as few topology groups as possible
(one when the job says `same_group`), then from the nodes with the fewest free GPUs that
still hold a member, which keeps whole nodes for bigger gangs.
"""

from scheduler.core.placement.capacity import FreeCapacity
from scheduler.core.placement.gangs import spread
from scheduler.core.placement.state import Choice, Members

__all__ = ["Choice", "FreeCapacity", "Members", "spread"]
