"""The simulated fleet's free capacity: per GPU the memory and compute left, per node the
host CPUs and memory left and the count of wholly free GPUs, and the node states a
snapshot shows (rebuilt only for the nodes a start or stop touched)."""

from __future__ import annotations

import math

from scheduler.core.model import FULL_COMPUTE, GpuState, Member, NodeState
from scheduler.sim.cluster import ClusterSpec
from scheduler.sim.jobs import JobSpec


class FreeGpus:
    def __init__(self, cluster: ClusterSpec) -> None:
        self.nodes: dict[str, NodeState] = {n.name: n for n in cluster.node_states()}
        # Per GPU [free memory, free compute]; per node the count of wholly free GPUs.
        self._free: dict[str, list[list[int]]] = {
            n.name: [[g.memory_mb, FULL_COMPUTE] for g in n.gpus] for n in self.nodes.values()
        }
        self.free_whole: dict[str, int] = {n.name: len(n.gpus) for n in self.nodes.values()}
        self.idle = cluster.total_gpus  # wholly free GPUs
        # Host CPUs and memory left per node; None where the node does not limit them.
        self._free_cpus: dict[str, int | None] = {n.name: n.cpus for n in cluster.nodes}
        self._free_mem: dict[str, int | None] = {n.name: n.host_memory_mb for n in cluster.nodes}
        self._dirty: set[str] = set()
        self._cluster = cluster
        self._group: dict[str, str] = {n.name: n.group for n in cluster.nodes}
        self._widest: dict[str | None, int] = {}  # GPU model -> most GPUs on one node

    def can_fit(self, spec: JobSpec, node: str, gpu_indices: tuple[int, ...]) -> str | None:
        """None when one member of the job fits there now; otherwise why not."""
        ns = self.nodes.get(node)
        if ns is None:
            return f"unknown node {node}"
        if not ns.schedulable:
            return f"node {node} takes no work"
        want = spec.gpus_on_each_node or 1
        if len(gpu_indices) != want or len(set(gpu_indices)) != want:
            return f"job {spec.id} needs {want} GPUs on node {node}, got {list(gpu_indices)}"
        if not self.host_room(spec, node):
            return (
                f"node {node} has {self._free_cpus[node]} CPUs and {self._free_mem[node]} MiB "
                f"free; job {spec.id} needs {spec.cpus} and {spec.memory_mb} per node"
            )
        free = self._free[node]
        for i in gpu_indices:
            if not 0 <= i < len(free):
                return f"node {node} has no GPU {i}"
            gpu = ns.gpus[i]
            if spec.gpu_model and gpu.model != spec.gpu_model:
                return f"job {spec.id} needs {spec.gpu_model}, GPU {node}/{i} is {gpu.model}"
            mem, comp = free[i]
            if spec.gpus:
                if mem < gpu.memory_mb or comp < FULL_COMPUTE:
                    return f"GPU {node}/{i} is not free"
            elif mem < (spec.gpu_memory_mb or 0) or comp < (spec.gpu_compute_percent or 0):
                return f"GPU {node}/{i} lacks room for job {spec.id}"
        return None

    def host_room(self, spec: JobSpec, node: str) -> bool:
        """Whether the node's free host CPUs and memory hold one member of the job."""
        cpus, mem = self._free_cpus[node], self._free_mem[node]
        return (cpus is None or cpus >= spec.cpus) and (mem is None or mem >= spec.memory_mb)

    def whole_free_indices(self, node: str) -> list[int]:
        gpus = self.nodes[node].gpus
        return [
            i
            for i, (mem, comp) in enumerate(self._free[node])
            if mem >= gpus[i].memory_mb and comp >= FULL_COMPUTE
        ]

    def take(self, spec: JobSpec, node: str, gpu_indices: tuple[int, ...], sign: int) -> None:
        free = self._free[node]
        gpus = self.nodes[node].gpus
        for i in gpu_indices:
            cell = free[i]
            was_whole = cell[0] >= gpus[i].memory_mb and cell[1] >= FULL_COMPUTE
            if spec.gpus:
                cell[0] += sign * gpus[i].memory_mb
                cell[1] += sign * FULL_COMPUTE
            else:
                cell[0] += sign * (spec.gpu_memory_mb or 0)
                cell[1] += sign * (spec.gpu_compute_percent or 0)
            is_whole = cell[0] >= gpus[i].memory_mb and cell[1] >= FULL_COMPUTE
            self.free_whole[node] += int(is_whole) - int(was_whole)
            self.idle += int(is_whole) - int(was_whole)
        cpus, mem = self._free_cpus[node], self._free_mem[node]
        if cpus is not None and spec.cpus:
            self._free_cpus[node] = cpus + sign * spec.cpus
        if mem is not None and spec.memory_mb:
            self._free_mem[node] = mem + sign * spec.memory_mb
        self._dirty.add(node)

    # -- what a policy sees ------------------------------------------------------------------

    def node_states(self) -> tuple[NodeState, ...]:
        for name in self._dirty:
            old = self.nodes[name]
            free = self._free[name]
            gpus = list(old.gpus)
            for p, g in enumerate(gpus):
                mem, comp = free[g.index]
                # (A GPU no start or stop changed keeps its frozen state.)
                if g.free_memory_mb != mem or g.free_compute_percent != comp:
                    gpus[p] = GpuState(g.index, g.model, g.memory_mb, mem, comp)
            self.nodes[name] = NodeState(
                name=name,
                gpus=tuple(gpus),
                schedulable=old.schedulable,
                labels=old.labels,
                cpus=old.cpus,
                memory_mb=old.memory_mb,
                free_cpus=self._free_cpus[name],
                free_memory_mb=self._free_mem[name],
                group=old.group,
            )
        self._dirty.clear()
        return tuple(self.nodes.values())

    def spread_slowdown(self, spec: JobSpec, members: tuple[Member, ...], rate: float) -> float:
        """How much slower the job's work runs on these members (1.0: not at all), at
        `rate` per extra node and per extra topology group."""
        if len(members) < 2 or rate <= 0:
            return 1.0
        widest = self._widest.get(spec.gpu_model)
        if widest is None:
            widest = max(
                (n.gpus for n in self._cluster.nodes if spec.gpu_model in (None, n.model)),
                default=1,
            )
            self._widest[spec.gpu_model] = widest
        extra_nodes = len(members) - math.ceil(spec.gpus / widest)
        groups = {self._group[m.node] for m in members}
        extra_groups = len(groups) - 1 if "" not in groups else 0
        return 1.0 + rate * (max(0, extra_nodes) + extra_groups)

    def speed_on(self, spec: JobSpec, members: tuple[Member, ...]) -> float:
        """The job's speed on these GPUs: the slowest GPU's model decides (a gang moves in
        lockstep)."""
        return min(
            spec.speed_on(self.nodes[m.node].gpus[i].model) for m in members for i in m.gpu_indices
        )
