"""GPU health findings on the control side: a hardware fault drains the node with a reason
that names the GPU, the same finding again (redelivered, resent every tick, resent after a
resume) changes nothing, staff resume the node, and bad findings are refused and counted."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache

from fleet import tasks
from fleet.models import Job, Node
from fleet.selectors.telemetry import telemetry_refused
from fleet.services.agents import agent_register, node_key_create
from fleet.services.gpu_health import HEALTH_LABEL, gpu_findings_apply
from fleet.services.job_reports import job_report_apply
from fleet.services.job_states import SCHEDULER, job_transition
from fleet.services.telemetry import telemetry_refused_key
from tests.factories import JobFactory
from workers.wire import Signer, key_generate

pytestmark = pytest.mark.django_db

HEALTH = "fleet.tasks.gpu_health"


def _gpus(prefix: str, n: int = 4) -> list[dict[str, Any]]:
    return [
        {"index": i, "uuid": f"GPU-{prefix}{i}", "name": "NVIDIA A100-SXM4-80GB",
         "model": "A100-80GB", "memory_total_mb": 81920}
        for i in range(n)
    ]  # fmt: skip


@pytest.fixture
def host() -> tuple[Node, str]:
    node, key = node_key_create(name="gpu-h1")
    agent_register(node=node, backend="nvml", agent_version="t", gpus=_gpus("ab12"))
    cache._cache.get_client(write=True).delete(telemetry_refused_key(node.name))  # type: ignore[attr-defined]
    return Node.objects.get(pk=node.pk), key


def xid(index: int, code: int, key: str = "boot1", prefix: str = "ab12") -> dict[str, Any]:
    uuid = f"GPU-{prefix}{index}"
    return {"index": index, "uuid": uuid, "kind": "xid", "code": code, "detail": f"XID {code}",
            "key": f"{key}:{uuid}:xid:{code}:100.0:0"}  # fmt: skip


def send(key: str, findings: Any) -> None:
    tasks.gpu_health.run(**Signer(key).seal(HEALTH, "gpu-h1", {"findings": findings}, 60))


def test_an_xid_79_drains_the_node_naming_the_gpu_and_leaves_running_jobs(
    host: tuple[Node, str], owner: Any, team: Any
) -> None:
    node, key = host
    job: Any = JobFactory(owner=owner, team=team)
    job_transition(job_id=job.pk, action="dispatch", actor=SCHEDULER,
                   fields={"node": node, "gpu_indices": [2]})  # fmt: skip
    job_report_apply(node=node, job_id=job.pk, attempt=1, state="running", pid=99)

    send(key, [xid(2, 79)])

    node.refresh_from_db()
    assert node.state == "draining" and node.drain_requested
    assert node.state_reason == (
        "GPU 2 (GPU-ab122) reported XID 79 (fell off the bus); drained until staff resume it"
    )
    assert Job.objects.get(pk=job.pk).state == "running"  # only new work is kept off


def test_the_same_finding_again_changes_nothing_and_staff_resume_sticks(
    host: tuple[Node, str], staff_api: Any
) -> None:
    node, key = host
    send(key, [xid(1, 48)])
    send(key, [xid(1, 48)])  # the next tick
    node.refresh_from_db()
    assert node.state_reason.startswith("GPU 1 (GPU-ab121) reported XID 48 (double-bit ECC")
    assert node.state_reason.count("GPU 1") == 1

    response = staff_api.post(f"/api/v1/nodes/{node.name}/resume/")
    assert response.status_code == 200 and response.json()["state"] == "up"
    for _ in range(3):  # the agent goes on sending what it found
        send(key, [xid(1, 48)])
    node.refresh_from_db()
    assert (node.state, node.state_reason, node.drain_requested) == ("up", "", False)

    # A new fault drains it again.
    lost = {"index": 3, "uuid": "GPU-ab123", "kind": "lost", "code": None, "detail": "gone",
            "key": "boot1:GPU-ab123:lost"}  # fmt: skip
    send(key, [xid(1, 48), lost])
    node.refresh_from_db()
    assert node.state == "draining"
    assert node.state_reason == (
        "GPU 3 (GPU-ab123) reported that it is lost (fell off the bus); "
        "drained until staff resume it"
    )


def test_ecc_errors_drain_and_a_staff_drain_reason_is_kept_after_the_fault(
    host: tuple[Node, str], staff_api: Any
) -> None:
    node, key = host
    staff_api.post(f"/api/v1/nodes/{node.name}/drain/", {"reason": "PSU swap"}, format="json")
    ecc = {"index": 0, "uuid": "GPU-ab120", "kind": "ecc", "code": 2, "detail": "2 ECC",
           "key": "boot1:GPU-ab120:ecc:2"}  # fmt: skip

    assert gpu_findings_apply(node=node, findings=[ecc]) == [
        "GPU 0 (GPU-ab120) reported 2 uncorrectable ECC errors; drained until staff resume it"
    ]
    node.refresh_from_db()
    assert node.state == "draining"
    assert node.state_reason.endswith("; before: PSU swap")
    # One more error is a new count, and a new finding.
    more = dict(ecc, code=3, key="boot1:GPU-ab120:ecc:3")
    assert gpu_findings_apply(node=node, findings=[ecc, more]) != []
    assert gpu_findings_apply(node=node, findings=[ecc, more]) == []


def test_an_application_xid_is_logged_and_does_not_drain(host: tuple[Node, str]) -> None:
    node, key = host
    send(key, [xid(0, 13), xid(1, 31), xid(2, 43), xid(3, 45)])
    node.refresh_from_db()
    assert (node.state, node.drain_requested, node.state_reason) == ("up", False, "")
    assert HEALTH_LABEL not in node.labels


def test_bad_findings_are_refused_and_counted_and_the_good_one_is_kept(
    host: tuple[Node, str],
) -> None:
    node, key = host
    other, _ = node_key_create(name="gpu-h2")
    agent_register(node=other, backend="nvml", agent_version="t", gpus=_gpus("zz", 1))
    bad = [
        "XID 79",
        dict(xid(0, 79), code=79.5),
        dict(xid(0, 79), code=True),
        dict(xid(0, 79), code=-1),
        dict(xid(0, 79), index="0"),
        dict(xid(0, 79), kind="fire"),
        dict(xid(0, 79), key="x" * 500),
        dict(xid(0, 79), uuid="GPU-zz0"),  # another node's GPU
        dict(xid(0, 79), index=1),  # this node's GPU, at another index
    ]
    send(key, bad)
    node.refresh_from_db()
    assert (node.state, node.drain_requested) == ("up", False)
    assert telemetry_refused(node=node)["gpu_health"] == len(bad)

    send(key, "not a list")
    send(key, [*bad, xid(0, 79)])
    node.refresh_from_db()
    assert node.state == "draining" and node.state_reason.startswith("GPU 0 (GPU-ab120)")
    assert telemetry_refused(node=node)["gpu_health"] == 2 * len(bad) + 1
    other.refresh_from_db()
    assert other.state == "up"


def test_a_forged_health_message_drains_nothing(host: tuple[Node, str]) -> None:
    node, _ = host
    tasks.gpu_health.run(
        **Signer(key_generate()).seal(HEALTH, "gpu-h1", {"findings": [xid(0, 79)]}, 60)
    )
    node.refresh_from_db()
    assert node.state == "up"


def test_a_gpu_lost_before_its_agent_could_name_it_drains_by_its_index(
    host: tuple[Node, str],
) -> None:
    node, key = host
    unnamed = {"index": 5, "uuid": "", "kind": "lost", "code": None, "detail": "GPU is lost",
               "key": "boot1::lost"}  # fmt: skip
    send(key, [dict(unnamed, index=1)])  # index 1 is a registered GPU: it has a uuid
    assert Node.objects.get(pk=node.pk).state == "up"
    assert telemetry_refused(node=node)["gpu_health"] == 1

    send(key, [unnamed])
    node.refresh_from_db()
    assert node.state_reason == (
        "GPU 5 (uuid unreadable) reported that it is lost (fell off the bus); "
        "drained until staff resume it"
    )
