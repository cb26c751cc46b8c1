"""A job over two nodes end to end: the scheduling cycle places its members on two real
agents, each member's start carries the rendezvous, the members meet over TCP, both
outcomes reach the database and each member's output is readable under its rank."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from fleet.models import Job, JobMember
from scheduler.cycle.runner import run_cycle
from tests.factories import JobFactory
from tests.workers.agent_harness import ControlPump
from tests.workers.conftest import StartAgent
from tests.workers.test_rendezvous_e2e import MEMBER

pytestmark = pytest.mark.django_db

# The agents offer more than the test machine has: they are simulated hosts.
HOST = {"FLEET_NODE_CPUS": "64", "FLEET_NODE_MEMORY_MB": "512000", "FLEET_NODE_GROUP": "rack-1"}


def test_the_scheduler_places_a_job_over_two_agents_and_both_members_meet(
    agents: StartAgent, control: ControlPump, owner: Any, owner_api: Any, team: Any
) -> None:
    (node_a, _), (node_b, _) = agents("4xA100-80GB", HOST), agents("4xA100-80GB", HOST)
    assert (node_a.cpus, node_a.memory_mb, node_a.group, node_a.address) == (
        64, 512000, "rack-1", "127.0.0.1"
    )  # fmt: skip
    assert node_a.resource_enforcement  # "cgroup-v2", or "none: <why>"
    program = base64.b64encode(MEMBER.encode()).decode()
    job = JobFactory(
        owner=owner, team=team, gpus=6, gpus_per_node=3, cpus=1, memory_mb=100,
        command=f"/usr/bin/python3 -c \"import base64; exec(base64.b64decode('{program}'))\"",
    )  # fmt: skip

    record = control.run(run_cycle)
    assert record is not None and record.placed == 1

    def ended() -> Job | None:
        current = Job.objects.get(pk=job.pk)
        return current if current.state in ("succeeded", "failed", "lost") else None

    done = control.pump(ended, timeout=60, what="the job to end")
    assert done.state == "succeeded", done.state_reason
    members = JobMember.objects.filter(job=job, attempt=done.attempt).order_by("rank")
    assert [(m.rank, m.state, m.exit_code) for m in members] == [
        (0, "succeeded", 0),
        (1, "succeeded", 0),
    ]
    assert {m.node_id for m in members} == {node_a.pk, node_b.pk}

    def log(rank: int) -> Any:
        body = owner_api.get(f"/api/v1/jobs/{job.pk}/logs/?rank={rank}").json()
        return body if body.get("complete") else None

    common = "world_size=6 nnodes=2 local_world_size=3 nodelist=127.0.0.1,127.0.0.1"
    rank0 = control.pump(lambda: log(0), what="rank 0's log")
    rank1 = control.pump(lambda: log(1), what="rank 1's log")
    assert rank0["data"] == f"self: rank=0 {common}\npeer: rank=1 {common}\n"
    assert rank1["data"] == f"self: rank=1 {common}\npeer: rank=0 {common}\n"
    assert rank0["ranks"] == [0, 1]
