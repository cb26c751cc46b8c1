"""Admission at submit: the pure check (scheduler.core.admission) fed from the database.

Every registered node counts, down or draining ones too (they come back). With no GPU
registered yet every request is accepted: the fleet may still be coming up.

The GPU checks run on one node's share of the job (a multi-node job's `gpus_per_node`);
what only a spread job or host resources can hit is checked here too: enough nodes with
that share, in one topology group when the job asks for it, and CPU cores and host memory
on each node (a node that does not report them limits nothing). Team limits on the whole
job are checked by fleet.services.jobs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any
from uuid import uuid4

from django.db import connection, transaction

from fleet.errors import ApplicationError
from fleet.models import Gpu, Node, Team
from fleet.services.messaging import redis_client
from scheduler.core.admission import admission_error, host_limit_error
from scheduler.core.model import GpuState, NodeState, PendingJob, TeamState

log = logging.getLogger(__name__)

# Which request field a refusal is about, by how the pure message starts.
_FIELDS = (
    ("asks for", "gpus"),
    ("no node has", "gpu_model"),
    ("needs a ", "min_gpu_memory_mb"),
    ("a fractional job", "gpu_memory_mb"),
)


# Nodes grouped by shape (host CPUs, memory, group and GPUs in index order), counted: a
# fleet of a thousand identical nodes is one row, not eight thousand GPU rows.
_SHAPES_SQL = """
SELECT n.cpus, n.memory_mb, n."group", g.indices, g.models, g.memories, count(*)
FROM fleet_node n
JOIN (
    SELECT node_id, array_agg(index ORDER BY index) AS indices,
           array_agg(model ORDER BY index) AS models,
           array_agg(memory_mb ORDER BY index) AS memories
    FROM fleet_gpu GROUP BY node_id
) g ON g.node_id = n.id
GROUP BY 1, 2, 3, 4, 5, 6
ORDER BY 7 DESC, 1, 2, 3
"""


# The fleet's shape changes rarely (a node registers new GPUs or host resources, an admin
# deletes one) and is read on every submit, so each process keeps the last one it read. It
# is trusted while the shape generation (a value in the shared cache that every change
# replaces, see fleet_shape_changed) and the newest GPU row are the ones it was read under,
# and for at most SHAPE_TTL_S seconds.
# Read with the process's kept Redis client (every submit reads it: Django's cache would
# build a client per call) from the Redis the cache uses.
SHAPE_GENERATION_KEY = "fleet:admission:shape-generation"
SHAPE_TTL_S = 60.0
# The node fields admission reads beside its GPUs.
SHAPE_FIELDS = frozenset({"cpus", "memory_mb", "group"})
_NEWEST_GPU_SQL = f"SELECT max(id) FROM {Gpu._meta.db_table}"
_shape_memo: tuple[tuple[str, int | None], float, tuple[NodeState, ...]] | None = None


def fleet_shape_changed() -> None:
    """Say that a node's GPUs, host CPUs, memory or group changed: every process reads the
    fleet anew at its next submit. Call it inside the transaction that changes them; the
    generation is replaced now and again once that transaction commits, so a process that
    read the fleet in between (before the change was visible) does not keep what it read."""
    _new_shape_generation()
    transaction.on_commit(_new_shape_generation)


def _new_shape_generation() -> None:
    try:
        redis_client().set(SHAPE_GENERATION_KEY, uuid4().hex)
    except Exception:  # noqa: BLE001 - without the cache every submit reads the fleet
        log.warning("could not replace the fleet shape generation", exc_info=True)


def _shape_generation() -> tuple[str, int | None] | None:
    """What the fleet's shape is known by now, or None when the cache cannot say (then the
    fleet is read for every submit)."""
    try:
        client = redis_client()
        generation = client.get(SHAPE_GENERATION_KEY)
        if generation is None:
            client.set(SHAPE_GENERATION_KEY, uuid4().hex, nx=True)
            generation = client.get(SHAPE_GENERATION_KEY)
    except Exception:  # noqa: BLE001
        return None
    if generation is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(_NEWEST_GPU_SQL)
        (newest,) = cursor.fetchone()
    return generation.decode(), newest


def fleet_nodes() -> tuple[NodeState, ...]:
    """Every node with GPUs, with its GPUs, host CPUs, memory and group, as admission sees
    them (what is free does not matter, and neither do names: on PostgreSQL the nodes of one
    shape are one NodeState, repeated, named after the shape). Read on every single submit:
    from this process's copy while the fleet's shape generation says it is current (two
    small reads), else with one query whose size grows with the kinds of node, not with
    the fleet."""
    global _shape_memo
    generation = _shape_generation()
    memo, now = _shape_memo, time.monotonic()
    if generation is not None and memo is not None:
        if memo[0] == generation and now - memo[1] < SHAPE_TTL_S:
            return memo[2]
    nodes = _read_fleet_nodes()
    if generation is not None:
        _shape_memo = (generation, now, nodes)
    return nodes


def _read_fleet_nodes() -> tuple[NodeState, ...]:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_SHAPES_SQL)
            rows = cursor.fetchall()
        nodes: list[NodeState] = []
        for shape, (cpus, memory_mb, group, indices, models, memories, count) in enumerate(rows):
            gpus = tuple(
                GpuState(index, model, memory, memory)
                for index, model, memory in zip(indices, models, memories, strict=True)
            )
            state = NodeState(f"shape-{shape}", gpus, cpus=cpus, memory_mb=memory_mb, group=group)
            nodes.extend([state] * count)
        return tuple(nodes)
    by_node: dict[int, list[GpuState]] = {}
    for node_id, index, model, memory in Gpu.objects.order_by().values_list(
        "node_id", "index", "model", "memory_mb"
    ):
        by_node.setdefault(node_id, []).append(GpuState(index, model, memory, memory))
    hosts = {
        row[0]: row[1:]
        for row in Node.objects.filter(id__in=list(by_node))
        .order_by()
        .values_list("id", "name", "cpus", "memory_mb", "group")
    }
    return tuple(
        NodeState(
            hosts[node_id][0],
            tuple(sorted(g, key=lambda gpu: gpu.index)),
            cpus=hosts[node_id][1],
            memory_mb=hosts[node_id][2],
            group=hosts[node_id][3],
        )
        for node_id, g in by_node.items()
        if node_id in hosts
    )


def _size(mb: int) -> str:
    return f"{mb // 1024} GB" if mb % 1024 == 0 else f"{mb} MB"


def host_error(job: PendingJob, nodes: tuple[NodeState, ...]) -> tuple[str, str] | None:
    """(field, sentence) when no node offers the CPU cores or host memory one member asks
    for, or too few nodes (in one group, when required) can take a member; else None."""
    sized = [n for n in nodes if n.cpus is not None]
    if job.cpus and sized and all(job.cpus > (n.cpus or 0) for n in sized):
        most = max(n.cpus or 0 for n in sized)
        where = "on each node" if job.nodes > 1 else ""
        return (
            "cpus",
            f"needs {job.cpus} CPU cores{' ' + where if where else ''}; the largest node offers {most}",
        )
    sized = [n for n in nodes if n.memory_mb is not None]
    if job.memory_mb and sized and all(job.memory_mb > (n.memory_mb or 0) for n in sized):
        most = max(n.memory_mb or 0 for n in sized)
        where = " on each node" if job.nodes > 1 else ""
        return (
            "memory_mb",
            f"needs {_size(job.memory_mb)} of host memory{where}; the largest node has "
            f"{_size(most)}",
        )
    if job.nodes <= 1:
        return None
    share = job.gpus_on_each_node
    fits = [n for n in nodes if _takes_member(job, n, share)]
    groups: dict[str, int] = {}
    for node in fits:
        groups[node.group] = groups.get(node.group, 0) + 1
    if job.same_group:
        best = max(groups.items(), key=lambda item: item[1], default=("", 0))
        if best[1] < job.nodes:
            return (
                "nodes",
                f"needs {job.nodes} nodes with {share} free GPUs each in one group; the "
                f"largest group ({best[0] or 'no group'}) has {best[1]}",
            )
    elif len(fits) < job.nodes:
        return (
            "nodes",
            f"needs {job.nodes} nodes with {share} GPUs each; the fleet has {len(fits)}",
        )
    return None


def _takes_member(job: PendingJob, node: NodeState, share: int) -> bool:
    """Whether the node could ever hold one member of the job."""
    matching = [
        g
        for g in node.gpus
        if (job.gpu_model is None or g.model == job.gpu_model)
        and g.memory_mb >= (job.min_gpu_memory_mb or 0)
    ]
    return (
        len(matching) >= share
        and (node.cpus is None or job.cpus <= node.cpus)
        and (node.memory_mb is None or job.memory_mb <= node.memory_mb)
    )


def team_state(team: Team) -> TeamState:
    return TeamState(
        slug=team.slug,
        guaranteed_gpus=team.guaranteed_gpus,
        hard_limit_gpus=team.gpu_limit,
        user_gpu_cap=team.user_gpu_cap,
        priority_weight=team.priority_weight,
        fairshare_weight=team.fairshare_weight,
        hard_limit_cpus=team.cpu_limit,
        hard_limit_memory_mb=team.memory_mb_limit,
    )


def pending_job(values: dict[str, Any], team: Team, user: str, *, job_id: int = 0) -> PendingJob:
    """A would-be job from validated submit values (see fleet.services.jobs)."""
    return PendingJob(
        id=job_id,
        team=team.slug,
        user=user,
        submitted_at=0.0,
        time_limit=float(values["time_limit"]),
        gpus=values["gpus"],
        gpu_memory_mb=values.get("gpu_memory_mb"),
        gpu_compute_percent=values.get("gpu_compute_percent"),
        gpu_model=values.get("gpu_model") or None,
        min_gpu_memory_mb=values.get("min_gpu_memory_mb"),
        priority=values.get("priority", 0),
        qos=values.get("qos", "normal"),
        preemptible=values.get("preemptible", False),
        name=values.get("name", ""),
        gpus_per_node=values.get("gpus_per_node", 0),
        cpus=values.get("cpus", 0),
        memory_mb=values.get("memory_mb", 0),
        same_group=values.get("same_group", False),
    )


def _field_for(message: str, job: PendingJob) -> str:
    if message.startswith("asks for") and job.gpus == 0:
        return "gpu_compute_percent" if " % " in message else "gpu_memory_mb"
    for needle, name in (("host memory", "memory_mb"), ("CPU cores", "cpus")):
        if needle in message:
            return name
    if job.nodes > 1 and ("nodes with" in message or "topology group" in message):
        return "nodes"
    for prefix, name in _FIELDS:
        if message.startswith(prefix):
            return name
    return "gpus"


def admit(
    values: dict[str, Any], team: Team, user: str, nodes: tuple[NodeState, ...] | None = None
) -> dict[str, Any]:
    """The values with the GPU model spelled as the fleet spells it; ApplicationError (400,
    naming the field) for a job that could never start. `nodes`: the fleet as `fleet_nodes`
    read it (a request that checks many jobs reads it once); default: read now."""
    if nodes is None:
        nodes = fleet_nodes()
    if not nodes:
        return values
    if values.get("gpu_model"):
        models = sorted({g.model for n in nodes for g in n.gpus})
        wanted = values["gpu_model"].lower()
        canonical = next((m for m in models if m.lower() == wanted), None)
        if canonical is None:
            message = (
                f"No node has GPU model '{values['gpu_model']}'. Models in the fleet: "
                f"{', '.join(models)}."
            )
            raise ApplicationError(message, {"fields": {"gpu_model": [message]}})
        values = {**values, "gpu_model": canonical}
    job = pending_job(values, team, user)
    # The GPU checks on one node's share; the whole job's team limits are checked on submit.
    member = replace(job, gpus=job.gpus_on_each_node, gpus_per_node=0) if job.nodes > 1 else job
    error = admission_error(member, nodes, None if job.nodes > 1 else team_state(team))
    if error is None and job.nodes > 1:
        error = host_limit_error(job, team_state(team))
    if error is not None:
        field = _field_for(error, job)
        raise ApplicationError(error, {"fields": {field: [error]}})
    host = host_error(job, nodes)
    if host is not None:
        field, error = host
        raise ApplicationError(_sentence(error), {"fields": {field: [_sentence(error)]}})
    return values


def _sentence(text: str) -> str:
    return text if text.endswith(".") else f"{text}."
