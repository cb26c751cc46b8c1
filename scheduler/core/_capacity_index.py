"""Index structures behind FreeCapacity (see scheduler.core.placement)."""

from __future__ import annotations

from typing import Any

from scheduler.core.model import FULL_COMPUTE, GpuState, NodeState, nodes_spanned

Kind = tuple[str, int]


def _lowest_bit(mask: int) -> int:
    return (mask & -mask).bit_length() - 1


class _Node:
    __slots__ = (
        "name",
        "pos",
        "schedulable",
        "gpus",
        "index_of",
        "kind_of",
        "mem",
        "comp",
        "whole",
        "version",
        "cpus",
        "ram",
        "cpus_total",
        "ram_total",
        "group",
    )

    def __init__(self, state: NodeState, pos: int) -> None:
        self.name = state.name
        self.pos = pos
        self.schedulable = state.schedulable
        self.gpus: tuple[GpuState, ...] = state.gpus
        self.index_of = {g.index: p for p, g in enumerate(state.gpus)}
        self.kind_of: list[Kind] = [(g.model, g.memory_mb) for g in state.gpus]
        self.mem = [max(0, min(g.free_memory_mb, g.memory_mb)) for g in state.gpus]
        self.comp = [max(0, min(g.free_compute_percent, FULL_COMPUTE)) for g in state.gpus]
        # Positions of wholly free GPUs per kind, ascending.
        self.whole: dict[Kind, list[int]] = {}
        # Bumped on every change of this node's free capacity.
        self.version = 0
        # Free host CPU cores and memory (MB); None when the node does not report them.
        self.cpus: int | None = _free(state.free_cpus, state.cpus)
        self.ram: int | None = _free(state.free_memory_mb, state.memory_mb)
        self.cpus_total = state.cpus if state.cpus is not None else self.cpus
        self.ram_total = state.memory_mb if state.memory_mb is not None else self.ram
        self.group = state.group

    def host_fits(self, cpus: int, memory_mb: int) -> bool:
        """Whether the node's free host CPUs and memory hold a member asking for these."""
        return (self.cpus is None or self.cpus >= cpus) and (
            self.ram is None or self.ram >= memory_mb
        )

    def host_add(self, cpus: int, memory_mb: int) -> None:
        """Change the free host CPUs and memory by these amounts (negative books them),
        kept between none and the node's total."""
        if self.cpus is not None and cpus:
            self.cpus = max(0, self.cpus + cpus)
            if self.cpus_total is not None:
                self.cpus = min(self.cpus, self.cpus_total)
        if self.ram is not None and memory_mb:
            self.ram = max(0, self.ram + memory_mb)
            if self.ram_total is not None:
                self.ram = min(self.ram, self.ram_total)
        self.version += 1

    @classmethod
    def copy_of(cls, template: _Node, pos: int) -> _Node:
        """A fresh working copy of a node built earlier from the same (frozen) NodeState:
        shared read-only parts, copied free amounts and whole-GPU lists."""
        node = cls.__new__(cls)
        node.name = template.name
        node.pos = pos
        node.schedulable = template.schedulable
        node.gpus = template.gpus
        node.index_of = template.index_of
        node.kind_of = template.kind_of
        node.mem = template.mem.copy()
        node.comp = template.comp.copy()
        node.whole = {k: v.copy() for k, v in template.whole.items()}
        node.version = 0
        node.cpus, node.ram, node.group = template.cpus, template.ram, template.group
        node.cpus_total, node.ram_total = template.cpus_total, template.ram_total
        return node


class _KindIndex:
    __slots__ = (
        "model",
        "memory_mb",
        "buckets",
        "bmask",
        "partial",
        "pmask",
        "whole_total",
        "free",
    )

    def __init__(self, model: str, memory_mb: int, max_per_node: int) -> None:
        self.model = model
        self.memory_mb = memory_mb
        # buckets[c]: nodes (by position, insertion-ordered) with exactly c wholly free GPUs.
        self.buckets: list[dict[int, None]] = [{} for _ in range(max_per_node + 1)]
        self.bmask = 0
        # partial[c]: (node position, gpu position) of partly used GPUs with c % compute free.
        self.partial: list[dict[tuple[int, int], None]] = [{} for _ in range(FULL_COMPUTE + 1)]
        self.pmask = 0
        self.whole_total = 0
        # Free compute percent over the kind's schedulable GPUs that have memory left.
        self.free = 0

    def bucket_add(self, count: int, node_pos: int) -> None:
        if count:
            self.buckets[count][node_pos] = None
            self.bmask |= 1 << count

    def bucket_remove(self, count: int, node_pos: int) -> None:
        if count:
            bucket = self.buckets[count]
            del bucket[node_pos]
            if not bucket:
                self.bmask &= ~(1 << count)

    def partial_add(self, comp: int, key: tuple[int, int]) -> None:
        self.partial[comp][key] = None
        self.pmask |= 1 << comp

    def partial_remove(self, comp: int, key: tuple[int, int]) -> None:
        bucket = self.partial[comp]
        del bucket[key]
        if not bucket:
            self.pmask &= ~(1 << comp)


def _free(free: int | None, total: int | None) -> int | None:
    """What is free of a host resource: the free amount, else the total, else None."""
    if free is not None:
        return max(0, free)
    return None if total is None else max(0, total)


def _usable(mem: int, comp: int) -> int:
    """What a GPU adds to its kind's free compute: its free percent while memory is left."""
    return comp if comp > 0 and mem > 0 else 0


def _is_whole(mem: int, comp: int, gpu: GpuState) -> bool:
    return comp >= FULL_COMPUTE and mem >= gpu.memory_mb


def _is_partial(mem: int, comp: int, gpu: GpuState) -> bool:
    return comp > 0 and mem > 0 and not _is_whole(mem, comp, gpu)


def per_node_gpus(job: Any) -> int:
    """Whole GPUs the job takes on each of its nodes (all of them for a one-node job)."""
    per = getattr(job, "gpus_per_node", 0)
    if per and job.gpus > per:
        return int(job.gpus // (job.gpus // per))
    return int(job.gpus)


def node_count(job: Any) -> int:
    """How many nodes the job spans."""
    return nodes_spanned(int(job.gpus), getattr(job, "gpus_per_node", 0) or 0)


def host_request(job: Any) -> tuple[int, int]:
    """(CPU cores, memory MB) the job asks of each node it uses."""
    return int(getattr(job, "cpus", 0) or 0), int(getattr(job, "memory_mb", 0) or 0)


def _request(job: Any) -> tuple[int, int]:
    """(memory MB, compute %) a fractional job takes from its GPU."""
    return int(job.gpu_memory_mb or 0), int(job.gpu_compute_percent or 0)
