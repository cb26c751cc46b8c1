"""Fixtures for the scheduling cycle: nodes in each state, jobs made directly in the
database, and a recorder for the messages the cycle sends after commit."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from fleet.models import Job, JobState, Node
from tests.factories import GpuFactory, JobFactory, NodeFactory


def make_node(name: str, gpus: int = 4, *, state: str = "up", model: str = "A100-80GB") -> Node:
    node = NodeFactory(name=name, state=state, gpu_backend="simulated")
    for i in range(gpus):
        GpuFactory(node=node, index=i, model=model, memory_mb=81920 if "A100" in model else 32768)
    return node


def make_job(owner: Any, team: Any, **fields: Any) -> Job:
    return JobFactory(owner=owner, team=team, **fields)


def make_running(owner: Any, team: Any, node: Node, indices: list[int], **fields: Any) -> Job:
    fields.setdefault("gpus", len(indices))
    return JobFactory(
        owner=owner,
        team=team,
        state=JobState.RUNNING,
        node=node,
        gpu_indices=indices,
        attempt=1,
        assigned_at=timezone.now(),
        started_at=timezone.now(),
        **fields,
    )
