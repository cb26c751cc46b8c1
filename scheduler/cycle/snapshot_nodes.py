"""The snapshot's nodes: each node's row, its GPUs and what is taken of them and of its host.

A node whose row, GPU rows and allocations (the members and stopping attempts on it) read
the same as in the last snapshot of this process keeps its `NodeState`: the object is a
function of exactly those values. On a 1,000-node fleet most nodes keep theirs from one
cycle to the next, and building 8,000 `GpuState`s again cost a fifth of the snapshot. The
GPU inventory is read again only when its generation (scheduler.models.TableGeneration, set
by a trigger on every write to the GPU table) changes, and at least every
GPU_READ_EVERY_S seconds whatever it says; other databases read it every time.
"""

from __future__ import annotations

import operator
from time import monotonic
from types import MappingProxyType
from typing import Any

from django.db import connection

from fleet.models import Gpu, Node
from fleet.models.nodes import NodeState as NodeStatus
from scheduler.core.model import FULL_COMPUTE, GpuState, NodeState
from scheduler.models import TableGeneration

# What one member of an assigned/running attempt, or one stopping attempt's hold, takes on
# its node: (node id, GPU indices, gpus, GPU memory, compute share, CPU cores, host memory).
Allocation = tuple[int, Any, int, int | None, int | None, int, int]
GpuRow = tuple[int, int, str, int]  # node id, index, model, memory


# Seconds a process trusts its GPU rows while their generation reads the same: a bound on
# how long a write that fired no trigger (triggers disabled by an admin, a restore with
# session_replication_role "replica") could leave the inventory stale.
GPU_READ_EVERY_S = 300.0


class CarriedNodes:
    """The GPU rows by node with the generation and time they were read at, and node id ->
    (the values its `NodeState` was built from, the object), from the last build."""

    def __init__(self) -> None:
        self.generation: int | None = None
        self.read_at = 0.0
        self.gpus: dict[int, tuple[GpuRow, ...]] = {}
        self.nodes: dict[int, tuple[tuple[Any, ...], NodeState]] = {}
        self.last: tuple[NodeState, ...] = ()  # the nodes as the last build returned them
        self.reused = 0  # nodes kept by the last build (for tests and benches)


CARRIED_NODES = CarriedNodes()

_GPU_COLUMNS = ("node_id", "index", "model", "memory_mb")
_GENERATION_SQL = f'SELECT value FROM "{TableGeneration._meta.db_table}" WHERE "table" = %s'


def gpu_generation() -> int | None:
    """The GPU table's generation now, or None where there is none (not PostgreSQL, or its
    row is gone): then the rows are read every time."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(_GENERATION_SQL, [Gpu._meta.db_table])
        found = cursor.fetchone()
    return None if found is None else int(found[0])


def _gpu_rows(carried: CarriedNodes, *, now: float | None = None) -> dict[int, tuple[GpuRow, ...]]:
    now = monotonic() if now is None else now
    # Read before the rows: a write committed in between shows as a new generation next time.
    generation = gpu_generation()
    if (
        generation is not None
        and generation == carried.generation
        and 0 <= now - carried.read_at < GPU_READ_EVERY_S
    ):
        return carried.gpus
    by_node: dict[int, list[GpuRow]] = {}
    for row in Gpu.objects.order_by("node_id", "index").values_list(*_GPU_COLUMNS):
        by_node.setdefault(row[0], []).append(row)
    carried.gpus = {node_id: tuple(rows) for node_id, rows in by_node.items()}
    carried.generation, carried.read_at = generation, now
    return carried.gpus


def build_nodes(
    allocations: list[Allocation], *, carried: CarriedNodes = CARRIED_NODES
) -> tuple[tuple[NodeState, ...], dict[str, int], dict[int, str]]:
    """Every node (by name), name -> id and id -> name."""
    rows = list(
        Node.objects.values_list("id", "name", "state", "labels", "cpus", "memory_mb", "group")
    )
    gpus = _gpu_rows(carried)
    on_node: dict[int, list[Allocation]] = {}
    for allocation in allocations:
        on_node.setdefault(allocation[0], []).append(allocation)
    last = carried.nodes
    kept: dict[int, tuple[tuple[Any, ...], NodeState]] = {}
    reused = 0
    for row in rows:
        node_id = row[0]
        key = (row, gpus.get(node_id, ()), on_node.get(node_id))
        hit = last.get(node_id)
        if hit is not None and hit[0] == key:
            kept[node_id] = hit
            reused += 1
        else:
            kept[node_id] = (key, _node(row, key[1], key[2] or ()))
    carried.nodes, carried.reused = kept, reused
    names = {row[0]: row[1] for row in rows}
    nodes = tuple(kept[node_id][1] for node_id in sorted(names, key=lambda i: names[i]))
    last_nodes = carried.last
    if len(last_nodes) == len(nodes) and all(map(operator.is_, last_nodes, nodes)):
        # Every node the same object: the very tuple of the last build, which what is kept
        # by the tuple (the admission profile of the fleet) recognizes.
        nodes = last_nodes
    carried.last = nodes
    return nodes, {name: node_id for node_id, name in names.items()}, names


def _node(row: tuple[Any, ...], gpu_rows: tuple[GpuRow, ...], allocations: Any) -> NodeState:
    _, name, state, node_labels, cpus, memory_mb, group = row
    # index -> [memory taken, compute taken]
    used: dict[int, list[int]] = {}
    host = [0, 0]  # CPU cores, host memory taken
    for _, indices, whole, mem, comp, job_cpus, job_memory in allocations:
        host[0] += job_cpus or 0
        host[1] += job_memory or 0
        for index in indices or ():
            slot = used.setdefault(int(index), [0, 0])
            if whole:
                slot[0], slot[1] = 1 << 40, FULL_COMPUTE
            else:
                slot[0] += mem or 0
                slot[1] += comp or 0
    gpu_states = []
    for _, index, model, memory in gpu_rows:
        mem_used, comp_used = used.get(index, (0, 0))
        gpu_states.append(
            GpuState(
                index,
                model,
                memory,
                max(0, memory - mem_used),
                max(0, FULL_COMPUTE - comp_used),
            )
        )
    return NodeState(
        name,
        tuple(gpu_states),
        schedulable=state == NodeStatus.UP,
        labels=MappingProxyType({str(k): str(v) for k, v in (node_labels or {}).items()}),
        cpus=cpus,
        memory_mb=memory_mb,
        free_cpus=None if cpus is None else max(0, cpus - host[0]),
        free_memory_mb=None if memory_mb is None else max(0, memory_mb - host[1]),
        group=group,
    )
