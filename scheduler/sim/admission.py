"""Admission control in the simulator, as at submit in production: a job that can never fit
on the cluster is refused instead of queued."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from scheduler.core.admission import admission_error
from scheduler.core.model import NodeState, PendingJob
from scheduler.sim.cluster import ClusterSpec
from scheduler.sim.jobs import JobSpec
from scheduler.sim.transform import never_fits


class ArrivalAdmission:
    """Why a job can never start on the cluster, answered once per request shape."""

    def __init__(self, cluster: ClusterSpec, nodes: tuple[NodeState, ...]) -> None:
        self.cluster = cluster
        self._empty_nodes = nodes  # every node as it is with nothing running
        self._known: dict[tuple, str | None] = {}

    def refusal(self, spec: JobSpec, as_queued: Callable[[], PendingJob]) -> str | None:
        """The reason to refuse the job (None: it may queue). `as_queued`: the job as a
        policy would see it (asked only for a shape not seen before). A gang is checked
        member by member (one member's shape against the nodes) and for enough such
        nodes."""
        shape = (
            spec.gpus,
            spec.gpu_model,
            spec.gpu_memory_mb,
            spec.gpu_compute_percent,
            spec.gpus_per_node,
            spec.cpus,
            spec.memory_mb,
        )
        if shape not in self._known:
            probe = as_queued()
            if spec.nodes > 1:
                probe = replace(probe, gpus=spec.gpus_on_each_node, gpus_per_node=0)
            why = admission_error(probe, self._empty_nodes, None)
            self._known[shape] = why or never_fits(spec, self.cluster)
        return self._known[shape]
