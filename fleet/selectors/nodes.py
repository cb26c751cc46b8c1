from __future__ import annotations

from datetime import datetime

from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from fleet.errors import NotFound
from fleet.models import Gpu, GpuRelease, Job, JobMember, Node
from fleet.models.jobs import ACTIVE_STATES


def node_list() -> QuerySet[Node]:
    return Node.objects.prefetch_related(
        Prefetch("gpus", queryset=Gpu.objects.order_by("index")),
    )


def node_get(*, name: str) -> Node:
    node = node_list().filter(name=name).first()
    if node is None:
        raise NotFound(f"Node '{name}' does not exist.")
    return node


# One member's share of a node: the node's id, the GPU indices it holds there, its job.
Share = tuple[int, list[int], Job]


def active_shares(nodes: list[Node]) -> list[Share]:
    """What each assigned or running job holds on these nodes: one share per member of
    its current attempt (a multi-node job has one per node), else its own node and GPUs."""
    ids = [n.pk for n in nodes]
    jobs = (
        Job.objects.filter(Q(node__in=ids) | Q(members__node__in=ids), state__in=ACTIVE_STATES)
        .distinct()
        .select_related("owner", "team")
        .prefetch_related(
            Prefetch(
                "members",
                queryset=JobMember.objects.only("job_id", "attempt", "node_id", "gpu_indices"),
            )  # fmt: skip
        )
    )
    shares: list[Share] = []
    for job in jobs:
        members = [m for m in job.members.all() if m.attempt == job.attempt and m.node_id]
        if members:
            shares += [(m.node_id, [int(i) for i in m.gpu_indices or []], job) for m in members]  # type: ignore[misc]
        elif job.node_id:
            shares.append((job.node_id, [int(i) for i in job.gpu_indices or []], job))
    return [s for s in shares if s[0] in ids]


def gpu_jobs(
    nodes: list[Node], *, shares: list[Share] | None = None
) -> dict[tuple[int, int], list[Job]]:
    """Which jobs hold which GPU, derived from assigned and running jobs (every member of
    a multi-node job on its own node)."""
    holders: dict[tuple[int, int], list[Job]] = {}
    for node_id, indices, job in active_shares(nodes) if shares is None else shares:
        for index in indices:
            holders.setdefault((node_id, index), []).append(job)
    return holders


def node_usage(
    nodes: list[Node], *, shares: list[Share] | None = None, now: datetime | None = None
) -> dict[int, dict[str, int]]:
    """What is booked on each node: GPUs, CPU cores and MB of host memory of the members
    that are assigned or running there, plus what stopping attempts still hold (GpuRelease,
    until their end is reported or the hold expires), as the scheduler counts them."""
    now = now or timezone.now()
    gpus: dict[int, set[int]] = {n.pk: set() for n in nodes}
    usage = {n.pk: {"gpus": 0, "cpus": 0, "memory_mb": 0} for n in nodes}
    for node_id, indices, job in active_shares(nodes) if shares is None else shares:
        gpus[node_id].update(indices)
        usage[node_id]["cpus"] += job.cpus or 0
        usage[node_id]["memory_mb"] += job.memory_mb or 0
    releases = GpuRelease.objects.filter(node__in=nodes, expires_at__gt=now).values_list(
        "node_id", "gpu_indices", "cpus", "memory_mb"
    )
    for node_id, indices, cpus, memory_mb in releases:
        gpus[node_id].update(int(i) for i in indices or [])
        usage[node_id]["cpus"] += cpus or 0
        usage[node_id]["memory_mb"] += memory_mb or 0
    for node_id, held in gpus.items():
        usage[node_id]["gpus"] = len(held)
    return usage
