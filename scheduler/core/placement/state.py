"""The state behind FreeCapacity: the working copy of the fleet (from its base,
scheduler.core.placement.fleet_base), GPU-kind constraints and read-only accessors."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from scheduler.core._capacity_index import (
    Kind,
    _KindIndex,
    _Node,
    per_node_gpus,
)
from scheduler.core.fragmentation import (
    Demand,
    Scorer,
)
from scheduler.core.model import (
    GpuState,
    Member,
    NodeState,
    is_mig_device,
)
from scheduler.core.placement.fleet_base import fleet_base

Choice = tuple[str, tuple[int, ...]]
Members = tuple[Member, ...]


class CapacityState:
    """Free capacity per node and per GPU kind, with the constraints and read-only
    accessors; queries and bookings are added by the classes built on it."""

    def __init__(
        self,
        nodes: tuple[NodeState, ...],
        demand: Demand | None = None,
        demand_source: Callable[[], Demand] | None = None,
    ) -> None:
        # With a demand (or a source of one, read on the first placement that needs it),
        # one-node jobs and gang members go where they fragment the fleet least for that
        # demand (scheduler.core.fragmentation); without, plain best fit.
        self._aware = demand is not None or demand_source is not None
        self._scorer = None if demand is None else Scorer.for_demand(demand)
        self._demand_source = demand_source
        # The scorer's per-kind pressure, and free capacity booked or freed since.
        self._pressure: dict[Kind, float] | None = None
        self._moved = 0
        self._moved_limit = 0
        base = fleet_base(nodes)
        self._by_index = base.by_index.copy()
        self._nodes = base.nodes.copy()
        # Whether each node is still the base's (shared, read-only until `_own`).
        self._shared = [True] * len(nodes)
        self._by_name = base.by_name.copy()
        self._kinds = base.working_kinds()
        self._eligible_cache: dict[tuple[str | None, int, bool], list[_KindIndex]] = {}
        self._fails: set[tuple[Any, ...]] = set()
        self._roomiest: dict[tuple[Any, ...], tuple[int, Any]] = {}
        self.version = 0
        # Whether some node reports host CPUs or memory (else they limit nothing).
        self._host = base.host

    def _own(self, name: str) -> _Node:
        """The node, copied from its template first if still shared, to book on."""
        n = self._by_name[name]
        if self._shared[n.pos]:
            n = _Node.copy_of(n, n.pos)
            self._nodes[n.pos] = self._by_name[name] = n
            self._shared[n.pos] = False
        return n

    @property
    def fragmentation_aware(self) -> bool:
        return self._aware

    def scorer(self) -> Scorer | None:
        """The fragmentation scorer (built from the demand source on first use), or None
        for plain best fit."""
        if self._scorer is None and self._demand_source is not None:
            self._scorer = Scorer.for_demand(self._demand_source())
            self._demand_source = None
        return self._scorer

    # -- constraints -------------------------------------------------------------------

    def eligible(self, job: Any, node: str | NodeState, gpu: int | GpuState) -> bool:
        """Whether the GPU's model and memory suit the job, whatever is free on it now."""
        if not isinstance(gpu, GpuState):
            name = node if isinstance(node, str) else node.name
            n = self._by_name[name]
            gpu = n.gpus[n.index_of[gpu]]
        return self._kind_ok(job, gpu.model, gpu.memory_mb)

    @staticmethod
    def _kind_ok(job: Any, model: str, memory_mb: int) -> bool:
        if job.gpu_model is not None and job.gpu_model != model:
            return False
        if _several_per_node(job) and is_mig_device(model):
            return False
        if job.min_gpu_memory_mb is not None and memory_mb < job.min_gpu_memory_mb:
            return False
        if job.gpus == 0 and memory_mb < (job.gpu_memory_mb or 0):
            return False
        return True

    @staticmethod
    def _kinds_key(job: Any) -> tuple[str | None, int, bool]:
        """What decides which GPU kinds a job may use: its model and memory needs, and
        whether it needs several GPUs on one node (no MIG devices then)."""
        need = max(job.min_gpu_memory_mb or 0, 0 if job.gpus else job.gpu_memory_mb or 0)
        return (job.gpu_model, need, _several_per_node(job))

    def _eligible_kinds(self, job: Any) -> list[_KindIndex]:
        key = self._kinds_key(job)
        need, several = key[1], key[2]
        kinds = self._eligible_cache.get(key)
        if kinds is None:
            kinds = [
                ki
                for ki in self._kinds.values()
                if (job.gpu_model is None or ki.model == job.gpu_model)
                and ki.memory_mb >= need
                and not (several and is_mig_device(ki.model))
            ]
            self._eligible_cache[key] = kinds
        return kinds

    @staticmethod
    def shape(job: Any) -> tuple[Any, ...]:
        """What decides where a job may go: its GPU count or fraction, how it spreads over
        nodes, its host CPUs and memory, and its constraints."""
        if job.gpus:
            return (
                job.gpus,
                job.gpu_model,
                job.min_gpu_memory_mb,
                job.gpus_per_node,
                job.cpus,
                job.memory_mb,
                job.same_group,
            )
        return (
            0,
            job.gpu_model,
            job.min_gpu_memory_mb,
            job.gpu_memory_mb,
            job.gpu_compute_percent,
            job.cpus,
            job.memory_mb,
        )

    def no_room_shapes(self) -> Collection[tuple[Any, ...]]:
        """The shapes (`shape`) best fit found no room for since the last release: no job of
        one fits until capacity is given back. Read-only."""
        return self._fails

    def partial_compute(self) -> dict[str, int]:
        """Per GPU model, the most free compute percent of a partly used schedulable GPU
        with room (models without one are absent)."""
        best: dict[str, int] = {}
        for ki in self._kinds.values():
            if ki.pmask:
                top = ki.pmask.bit_length() - 1
                if top > best.get(ki.model, 0):
                    best[ki.model] = top
        return best

    def node_version(self, node: str) -> int:
        """A counter that changes whenever the node's free capacity changes."""
        return self._by_name[node].version

    def free_gpus_total(self) -> int:
        """Wholly free GPUs on schedulable nodes."""
        return sum(ki.whole_total for ki in self._kinds.values())

    def free_on(self, node: str, gpu_index: int) -> tuple[int, int]:
        """(free MB, free compute %) of one GPU."""
        n = self._by_name[node]
        p = n.index_of[gpu_index]
        return n.mem[p], n.comp[p]

    def whole_free(self, node: str) -> tuple[int, ...]:
        """Indices of the wholly free GPUs on a node (empty if it is not schedulable)."""
        n = self._by_name[node]
        return tuple(sorted(n.gpus[p].index for ps in n.whole.values() for p in ps))

    def nodes_with_whole_free(self, k: int) -> list[str]:
        """Schedulable nodes with at least k wholly free GPUs of one kind, in fleet order
        (from the per-kind buckets: what changed, not a pass over the fleet)."""
        positions: set[int] = set()
        for ki in self._kinds.values():
            for count in range(max(k, 1), len(ki.buckets)):
                if (ki.bmask >> count) & 1:
                    positions.update(ki.buckets[count])
        return [self._nodes[p].name for p in sorted(positions)]

    def node_names(self) -> list[str]:
        return [n.name for n in self._nodes]

    def node_gpus(self, node: str) -> tuple[GpuState, ...]:
        return self._by_name[node].gpus

    def gpus_by_index(self, node: str) -> dict[int, GpuState]:
        """The node's GPUs by index; empty for an unknown or unschedulable node. Read-only."""
        return self._by_index.get(node, {})

    def is_schedulable(self, node: str) -> bool:
        n = self._by_name.get(node)
        return n is not None and n.schedulable

    def host_free(self, node: str) -> tuple[int | None, int | None]:
        """(free CPU cores, free memory MB) of a node; None where it does not report them."""
        n = self._by_name[node]
        return n.cpus, n.ram

    def host_limited(self) -> bool:
        """Whether some node reports host CPUs or memory."""
        return self._host

    def group_of(self, node: str) -> str:
        return self._by_name[node].group


def _several_per_node(job: Any) -> bool:
    """Whether the job needs more than one GPU on some node."""
    return per_node_gpus(job) > 1
