"""A registration cannot take another node's GPU: a uuid registered to another node is
refused, that GPU and its history stay as they are, and the refusal shows on the node that
asked. A GPU that really moved is released by its old node's next registration, or by an
admin deleting the old node or the GPU row."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleet.models import Gpu, Node, NodeState, TelemetryRollup, TelemetrySample
from fleet.services.agents import agent_register, node_key_create
from fleet.services.nodes import node_drain

pytestmark = pytest.mark.django_db

A100 = {"model": "A100-80GB", "memory_total_mb": 81920, "name": "NVIDIA A100-SXM4-80GB"}


def inventory(*uuids: str) -> list[dict[str, Any]]:
    return [{"index": i, "uuid": u, **A100} for i, u in enumerate(uuids)]


def register(name: str, *uuids: str) -> Node:
    node = Node.objects.filter(name=name).first() or node_key_create(name=name)[0]
    agent_register(node=node, backend="nvml", agent_version="1", gpus=inventory(*uuids))
    node.refresh_from_db()
    return node


def uuids_of(node: Node) -> list[str]:
    return list(Gpu.objects.filter(node=node).order_by("index").values_list("uuid", flat=True))


@pytest.fixture
def sim_a() -> Node:
    node = register("sim-a", "GPU-a0", "GPU-a1")
    gpu = Gpu.objects.get(uuid="GPU-a0")
    now = timezone.now()
    for i in range(3):
        TelemetrySample.objects.create(
            gpu=gpu, sampled_at=now - timedelta(seconds=10 * i), util_percent=50.0,
            memory_total_mb=81920,
        )  # fmt: skip
    TelemetryRollup.objects.create(
        gpu=gpu, minute=now.replace(second=0, microsecond=0), samples=3, memory_total_mb=81920
    )
    return node


def test_a_forged_registration_leaves_the_other_nodes_gpu_and_history_untouched(
    sim_a: Node, caplog: Any
) -> None:
    before = Gpu.objects.get(uuid="GPU-a0")
    forged = register("forged", "GPU-a0", "GPU-f1")
    after = Gpu.objects.get(uuid="GPU-a0")
    assert (after.pk, after.node_id, after.index) == (before.pk, sim_a.pk, 0)
    assert uuids_of(sim_a) == ["GPU-a0", "GPU-a1"]
    assert TelemetrySample.objects.filter(gpu=after).count() == 3
    assert TelemetryRollup.objects.filter(gpu=after).count() == 1
    # The rest of the forged node's inventory is applied; the refusal is said on it.
    assert uuids_of(forged) == ["GPU-f1"]
    assert forged.state == NodeState.UP
    assert "GPU-a0 (node sim-a)" in forged.state_reason
    assert "registered GPU GPU-a0, which is registered to node sim-a: refused" in caplog.text


def test_a_gpu_that_moved_is_released_by_its_old_nodes_next_registration(sim_a: Node) -> None:
    new = register("sim-new", "GPU-a1")  # the board is in the new host; sim-a not yet told
    assert uuids_of(new) == [] and "GPU-a1" in new.state_reason
    register("sim-a", "GPU-a0")  # sim-a's agent registers every minute: a1 is gone
    new = register("sim-new", "GPU-a1")
    assert uuids_of(new) == ["GPU-a1"] and uuids_of(sim_a) == ["GPU-a0"]
    assert new.state_reason == ""  # accepted whole: the note is gone


def test_deleting_the_old_node_frees_its_gpus(sim_a: Node) -> None:
    sim_a.delete()  # an admin removes a host that will not come back
    assert uuids_of(register("sim-new", "GPU-a0", "GPU-a1")) == ["GPU-a0", "GPU-a1"]


def test_a_draining_node_keeps_its_admins_reason(sim_a: Node, staff: Any) -> None:
    node = register("sim-c", "GPU-c0")
    node_drain(node=node, user=staff, reason="memory errors on GPU 0")
    node = register("sim-c", "GPU-c0", "GPU-a0")
    assert node.state_reason == "memory errors on GPU 0" and uuids_of(node) == ["GPU-c0"]


def test_admission_sees_a_registration_that_changes_the_fleets_shape() -> None:
    from scheduler.cycle.admission import fleet_nodes

    def shape() -> list[tuple[Any, ...]]:
        return sorted(
            (n.cpus, tuple((g.model, g.memory_mb) for g in n.gpus)) for n in fleet_nodes()
        )

    node = register("sim-s", "GPU-s0")
    assert shape() == [(None, (("A100-80GB", 81920),))]
    assert shape() == [(None, (("A100-80GB", 81920),))]  # kept between submits

    # The agent now reports other memory for the same GPU (updated in place, no new row).
    changed = [{"index": 0, "uuid": "GPU-s0", **A100, "memory_total_mb": 40960}]
    agent_register(node=node, backend="nvml", agent_version="1", gpus=changed)
    assert shape() == [(None, (("A100-80GB", 40960),))]

    # Host CPUs reported for the first time, then the same again (nothing changes).
    agent_register(node=node, backend="nvml", agent_version="1", gpus=changed, host={"cpus": 64})
    assert shape() == [(64, (("A100-80GB", 40960),))]
    agent_register(node=node, backend="nvml", agent_version="1", gpus=changed, host={"cpus": 64})
    assert shape() == [(64, (("A100-80GB", 40960),))]

    # An admin deletes the node: its GPUs go with it.
    Node.objects.filter(pk=node.pk).delete()
    assert shape() == []
