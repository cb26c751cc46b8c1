from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from fleet.models import Node
from tests.factories import GpuFactory, NodeFactory


@pytest.fixture(autouse=True)
def _no_shared_fragments(settings: Any) -> None:
    # Fragments shared between viewers live in Redis; tests render every request afresh.
    settings.FLEET_WEB_LIVE_CACHE_SECONDS = 0


def login(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def owner_web(owner: Any) -> Client:
    return login(owner)


@pytest.fixture
def outsider_web(outsider: Any) -> Client:
    return login(outsider)


@pytest.fixture
def stranger_web(stranger: Any) -> Client:
    return login(stranger)


@pytest.fixture
def staff_web(staff: Any) -> Client:
    return login(staff)


@pytest.fixture
def team_admin_web(team_admin: Any) -> Client:
    return login(team_admin)


@pytest.fixture
def racks(fleet_nodes: Any) -> list[Node]:
    """sim-a (4 A100) and sim-c (4 A100) in rack-1, sim-b (2 V100) in rack-2, each offering
    32 CPUs and 256 GB."""
    a, b = fleet_nodes
    c = NodeFactory(name="sim-c", gpu_backend="simulated")
    for i in range(4):
        GpuFactory(node=c, index=i, model="A100-80GB", memory_mb=81920)
    for node, group in ((a, "rack-1"), (b, "rack-2"), (c, "rack-1")):
        Node.objects.filter(pk=node.pk).update(
            cpus=32, memory_mb=262144, group=group, resource_enforcement="cgroup-v2"
        )
    return [Node.objects.get(pk=n.pk) for n in (a, b, c)]
