"""Multi-node jobs and host resources over REST and from agents: submitting a gang, the
400 sentences for what no fleet could run, team defaults for CPUs and memory, members in
the job's detail, a registration's host, and each member's output read by rank."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest

from fleet.models import Job, JobMember, Node
from fleet.services.agents import agent_register, node_key_create
from fleet.services.job_batches import Dispatch, job_dispatch_starts
from fleet.services.job_reports import job_report_apply
from fleet.services.job_states import SCHEDULER
from fleet.services.telemetry_logs import log_chunk_store
from tests.factories import GpuFactory, JobFactory

pytestmark = pytest.mark.django_db

SUBMIT = "/api/v1/jobs/"


def _submit(api: Any, **overrides: Any) -> Any:
    body = {"name": "train", "command": "torchrun train.py", **overrides}
    return api.post(SUBMIT, body, format="json")


@pytest.fixture
def hosts(db: Any) -> list[Node]:
    """Three nodes of 4 A100s; two in group rack-1 with 32 cores and 48 GB, one in rack-2
    with 16 cores and 32 GB."""
    nodes: list[Node] = []
    for name, group, cpus, memory in (
        ("gpu-1", "rack-1", 32, 48 * 1024),
        ("gpu-2", "rack-1", 32, 48 * 1024),
        ("gpu-3", "rack-2", 16, 32 * 1024),
    ):
        node = Node.objects.create(
            name=name, group=group, cpus=cpus, memory_mb=memory, address=f"10.1.0.{len(nodes)}"
        )
        for i in range(4):
            GpuFactory(node=node, index=i, model="A100-80GB", memory_mb=81920)
        nodes.append(node)
    return nodes


def test_submit_nodes_by_gpus_per_node(owner_api: Any, hosts: list[Node]) -> None:
    response = _submit(owner_api, nodes=3, gpus_per_node=4, cpus=8, memory_mb=16384)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["gpus"], body["gpus_per_node"], body["nodes"]) == (12, 4, 3)
    assert (body["cpus"], body["memory_mb"], body["members"]) == (8, 16384, [])
    same = _submit(owner_api, gpus=8, gpus_per_node=4).json()
    assert (same["gpus"], same["nodes"]) == (8, 2)


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        (
            {"gpus": 10, "gpus_per_node": 4},
            "gpus",
            "gpus (10) must be a multiple of gpus_per_node (4), one share per node: ask for 8 "
            "or 12.",
        ),
        ({"nodes": 2}, "nodes", "nodes needs gpus_per_node"),
        ({"nodes": 2, "gpus_per_node": 4, "gpus": 4}, "gpus", "(2 x 4 = 8)"),
        (
            {"gpus": 0, "gpu_memory_mb": 100, "gpu_compute_percent": 10, "gpus_per_node": 1},
            "gpus_per_node",
            "takes whole GPUs",
        ),
        (
            {"gpus": 4, "memory_mb": 64 * 1024},
            "memory_mb",
            ("needs 64 GB of host memory", "the largest node has 48 GB"),
        ),
        (
            {"nodes": 2, "gpus_per_node": 4, "cpus": 48},
            "cpus",
            ("needs 48 CPU cores", "the largest node has 32"),
        ),
        (
            {"nodes": 4, "gpus_per_node": 4},
            "nodes",
            "needs 4 nodes with 4 GPUs each; the fleet has 3.",
        ),
        (
            {"nodes": 3, "gpus_per_node": 4, "same_group": True},
            "nodes",
            "needs 3 nodes with 4 free GPUs each in one group; the largest group (rack-1) has 2.",
        ),
        (
            {"nodes": 3, "gpus_per_node": 4, "memory_mb": 40 * 1024},
            "nodes",
            "needs 3 nodes with 4 GPUs each; the fleet has 2.",
        ),
        ({"nodes": 2, "gpus_per_node": 8}, "gpus", "the largest node has 4"),
    ],
)
def test_requests_no_fleet_could_run_get_a_sentence(
    owner_api: Any,
    hosts: list[Node],
    overrides: dict[str, Any],
    field: str,
    message: str | tuple[str, ...],
) -> None:
    response = _submit(owner_api, **overrides)
    assert response.status_code == 400, response.json()
    body = response.json()
    for needle in (message,) if isinstance(message, str) else message:
        assert needle in body["message"], body
    assert field in body["extra"]["fields"], body
    assert not Job.objects.exists()


def test_a_job_that_does_not_ask_gets_the_team_defaults_per_gpu_on_each_node(
    owner_api: Any, team: Any, hosts: list[Node]
) -> None:
    team.cpus_per_gpu, team.memory_mb_per_gpu = 4, 8192
    team.save()
    body = _submit(owner_api, nodes=2, gpus_per_node=4).json()
    assert (body["cpus"], body["memory_mb"]) == (16, 32768)
    asked = _submit(owner_api, gpus=2, cpus=3, memory_mb=1000).json()
    assert (asked["cpus"], asked["memory_mb"]) == (3, 1000)
    fraction = _submit(owner_api, gpus=0, gpu_memory_mb=1000, gpu_compute_percent=25).json()
    assert (fraction["cpus"], fraction["memory_mb"]) == (1, 2048)


def test_the_database_refuses_gpus_that_are_not_a_multiple_of_gpus_per_node(
    owner: Any, team: Any
) -> None:
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        JobFactory(owner=owner, team=team, gpus=6, gpus_per_node=4)
    JobFactory(owner=owner, team=team, gpus=8, gpus_per_node=4)


def _dispatch_gang(owner: Any, team: Any, hosts: list[Node]) -> Job:
    job: Any = JobFactory(owner=owner, team=team, gpus=8, gpus_per_node=4)
    (start,) = job_dispatch_starts(
        dispatches=[
            Dispatch(
                job.pk, 0, hosts[0].pk, (0, 1, 2, 3), "test", members=((hosts[2].pk, (0, 1, 2, 3)),)
            )
        ],
        actor=SCHEDULER,
    )
    return Job.objects.get(pk=start.job.id)


def test_the_detail_shows_every_member(
    owner: Any, team: Any, owner_api: Any, hosts: list[Node]
) -> None:
    job = _dispatch_gang(owner, team, hosts)
    job_report_apply(node=hosts[2], job_id=job.pk, attempt=1, state="running", pid=9)
    body = owner_api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["state"] == "assigned" and body["node"] == "gpu-1"
    assert [(m["rank"], m["node"], m["gpu_indices"], m["state"]) for m in body["members"]] == [
        (0, "gpu-1", [0, 1, 2, 3], "assigned"),
        (1, "gpu-3", [0, 1, 2, 3], "running"),
    ]
    listed = owner_api.get(SUBMIT).json()["results"][0]
    assert listed["id"] == job.pk and len(listed["members"]) == 2


def test_each_member_ships_its_own_output_read_by_rank(
    owner: Any, team: Any, owner_api: Any, stranger_api: Any, hosts: list[Node]
) -> None:
    job = _dispatch_gang(owner, team, hosts)

    def store(node: Node, rank: int, data: bytes) -> bool:
        return log_chunk_store(
            node=node, job_id=job.pk, attempt=1, offset=0, rank=rank,
            data_b64=base64.b64encode(data).decode(),
        )  # fmt: skip

    assert store(hosts[0], 0, b"rank zero\n")
    assert store(hosts[2], 1, b"rank one\n")
    assert not store(hosts[0], 1, b"not its rank\n")  # gpu-1 runs rank 0 only
    assert not store(hosts[1], 0, b"not a member\n")
    assert not store(hosts[2], 1, b"again\n")  # a redelivered chunk is stored once
    url = f"/api/v1/jobs/{job.pk}/logs/"
    first = owner_api.get(url).json()
    assert (first["data"], first["rank"], first["ranks"]) == ("rank zero\n", 0, [0, 1])
    second = owner_api.get(url, {"rank": 1}).json()
    assert (second["data"], second["rank"]) == ("rank one\n", 1)
    assert owner_api.get(url, {"rank": -1}).status_code == 400
    assert stranger_api.get(url, {"rank": 1}).status_code in (403, 404)


def test_registration_stores_the_host_and_refuses_nonsense(caplog: Any) -> None:
    node, _ = node_key_create(name="gpu-9")
    gpus = [{"index": 0, "uuid": "H-0", "model": "A100-80GB", "memory_total_mb": 81920}]
    host = {
        "cpus": 64, "memory_mb": 512000, "address": "10.2.0.9", "group": "rack-7",
        "enforcement": "cgroup-v2",
    }  # fmt: skip
    agent_register(node=node, backend="simulated", agent_version="1", gpus=gpus, host=host)
    node.refresh_from_db()
    assert (node.cpus, node.memory_mb, node.address, node.group) == (
        64,
        512000,
        "10.2.0.9",
        "rack-7",
    )
    assert node.resource_enforcement == "cgroup-v2"
    bad = {
        "cpus": -4,
        "memory_mb": 10**30,
        "address": "x" * 600,
        "group": 7,
        "enforcement": "none: no cgroup v2",
    }
    with caplog.at_level(logging.WARNING, logger="fleet.services.agents"):
        agent_register(node=node, backend="simulated", agent_version="1", gpus=gpus, host=bad)
    node.refresh_from_db()
    # Each refused value keeps what the node had; the sound one is stored.
    assert (node.cpus, node.memory_mb, node.address, node.group) == (
        64,
        512000,
        "10.2.0.9",
        "rack-7",
    )
    assert node.resource_enforcement == "none: no cgroup v2"
    refused = " | ".join(r.getMessage() for r in caplog.records)
    for name in ("cpus -4", "memory_mb", "address", "group"):
        assert name in refused
    # An old agent that sends no host leaves the fields as they are.
    agent_register(node=node, backend="simulated", agent_version="1", gpus=gpus)
    assert Node.objects.get(pk=node.pk).cpus == 64
    assert JobMember.objects.count() == 0
