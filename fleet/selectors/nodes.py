from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from fleet.errors import NotFound
from fleet.models import Gpu, Job, Node
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


def gpu_jobs(nodes: list[Node]) -> dict[tuple[int, int], list[Job]]:
    """Which jobs hold which GPU, derived from assigned and running jobs."""
    holders: dict[tuple[int, int], list[Job]] = {}
    jobs = Job.objects.filter(node__in=nodes, state__in=ACTIVE_STATES).select_related(
        "owner", "team"
    )
    for job in jobs:
        assert job.node_id is not None
        for index in job.gpu_indices or []:
            holders.setdefault((job.node_id, index), []).append(job)
    return holders
