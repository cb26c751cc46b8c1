from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleet.models import GpuRelease, Job, JobMember, Node

pytestmark = pytest.mark.django_db


def test_nodes_list_gpus_and_who_holds_them(
    owner_api: Any, outsider_api: Any, fleet_nodes: Any
) -> None:
    job_id = owner_api.post(
        "/api/v1/jobs/", {"name": "a", "command": "true"}, format="json"
    ).json()["id"]
    Job.objects.filter(id=job_id).update(state="running", node=fleet_nodes[0], gpu_indices=[2])
    nodes = outsider_api.get("/api/v1/nodes/").json()
    assert [n["name"] for n in nodes] == ["sim-a", "sim-b"]
    assert nodes[0]["simulated"] is True
    gpus = nodes[0]["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert gpus[2]["jobs"] == [{"id": job_id, "name": "a", "owner": "owner", "team": "vision"}]
    assert gpus[0]["jobs"] == []
    detail = outsider_api.get("/api/v1/nodes/sim-b/").json()
    assert detail["gpus"][0]["model"] == "V100-32GB"


def test_unknown_node_is_404(owner_api: Any) -> None:
    response = owner_api.get("/api/v1/nodes/nope/")
    assert (
        response.status_code == 404 and response.json()["message"] == "Node 'nope' does not exist."
    )


def test_drain_and_resume_are_for_staff(
    owner_api: Any, team_admin_api: Any, staff_api: Any, fleet_nodes: Any
) -> None:
    for api in (owner_api, team_admin_api):
        assert api.post("/api/v1/nodes/sim-a/drain/").status_code == 403
    response = staff_api.post("/api/v1/nodes/sim-a/drain/", {"reason": "disk swap"}, format="json")
    assert response.json()["state"] == "draining" and response.json()["state_reason"] == "disk swap"
    assert staff_api.post("/api/v1/nodes/sim-a/resume/").json()["state"] == "up"


def test_a_down_node_cannot_be_resumed_by_hand(staff_api: Any, fleet_nodes: Any) -> None:
    Node.objects.filter(name="sim-a").update(state="down")
    response = staff_api.post("/api/v1/nodes/sim-a/resume/")
    assert response.status_code == 409 and "heartbeat" in response.json()["message"]


def test_teams_are_readable_by_members(outsider_api: Any, team: Any) -> None:
    slugs = [t["slug"] for t in outsider_api.get("/api/v1/teams/").json()]
    assert slugs == ["speech", "vision"]
    assert outsider_api.get("/api/v1/teams/vision/").json()["gpu_limit"] == 16


def test_only_staff_patch_teams(team_admin_api: Any, staff_api: Any, team: Any) -> None:
    refused = team_admin_api.patch("/api/v1/teams/vision/", {"guaranteed_gpus": 4}, format="json")
    assert refused.status_code == 403
    body = staff_api.patch(
        "/api/v1/teams/vision/", {"guaranteed_gpus": 4, "user_gpu_cap": 2}, format="json"
    ).json()
    assert (body["guaranteed_gpus"], body["user_gpu_cap"], body["gpu_limit"]) == (4, 2, 16)


@pytest.mark.parametrize(
    ("patch", "field", "needle"),
    [
        ({"guaranteed_gpus": 20}, "gpu_limit", "cannot be below guaranteed_gpus (20)"),
        ({"priority_weight": 0}, "priority_weight", "must be greater than 0"),
        ({"default_time_limit": 10**7}, "default_time_limit", "cannot exceed max_time_limit"),
        ({"guaranteed_gpus": -1}, "guaranteed_gpus", "greater than or equal to 0"),
    ],
)
def test_team_patch_rejections(
    staff_api: Any, team: Any, patch: dict[str, Any], field: str, needle: str
) -> None:
    response = staff_api.patch("/api/v1/teams/vision/", patch, format="json")
    assert response.status_code == 400
    assert field in response.json()["extra"]["fields"] and needle in response.json()["message"]
    team.refresh_from_db()
    assert team.guaranteed_gpus == 0 and team.priority_weight == 1.0


def test_nodes_show_host_resources_and_what_gangs_use(
    owner_api: Any, outsider_api: Any, fleet_nodes: Any
) -> None:
    a, b = fleet_nodes
    Node.objects.filter(pk=a.pk).update(
        cpus=64, memory_mb=512_000, address="10.0.0.1", group="rack-1",
        resource_enforcement="cgroup-v2",
    )  # fmt: skip
    Node.objects.filter(pk=b.pk).update(
        cpus=32, memory_mb=256_000, address="10.0.0.2", group="rack-1",
        resource_enforcement="none: no cgroup v2 here",
    )  # fmt: skip
    body = {"name": "g", "command": "true", "nodes": 2, "gpus_per_node": 2, "cpus": 8,
            "memory_mb": 16_000}  # fmt: skip
    response = owner_api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    Job.objects.filter(pk=job.pk).update(state="running", node=a, gpu_indices=[0, 1], attempt=1)
    JobMember.objects.create(job=job, attempt=1, rank=0, node=a, gpu_indices=[0, 1])
    JobMember.objects.create(job=job, attempt=1, rank=1, node=b, gpu_indices=[0, 1])
    # A member of an earlier attempt holds nothing; a stopping attempt's hold does.
    JobMember.objects.create(job=job, attempt=0, rank=1, node=a, gpu_indices=[2, 3])
    GpuRelease.objects.create(
        node=a, job=job, attempt=0, gpu_indices=[3], gpus=1, cpus=2, memory_mb=1000,
        expires_at=timezone.now() + timedelta(minutes=1),
    )  # fmt: skip
    GpuRelease.objects.create(
        node=b, job=job, attempt=0, gpu_indices=[1], gpus=1, cpus=2, memory_mb=1000,
        expires_at=timezone.now() - timedelta(minutes=1),
    )  # fmt: skip
    nodes = {n["name"]: n for n in outsider_api.get("/api/v1/nodes/").json()}
    sim_a, sim_b = nodes["sim-a"], nodes["sim-b"]
    assert (sim_a["cpus"], sim_a["memory_mb"], sim_a["address"], sim_a["group"]) == (
        64, 512_000, "10.0.0.1", "rack-1",
    )  # fmt: skip
    assert sim_a["resource_enforcement"] == "cgroup-v2"
    assert sim_b["resource_enforcement"].startswith("none:")
    assert sim_a["used"] == {"gpus": 3, "cpus": 10, "memory_mb": 17_000}
    assert sim_b["used"] == {"gpus": 2, "cpus": 8, "memory_mb": 16_000}
    # Rank 1's GPUs on sim-b name the job too.
    assert [j["id"] for j in sim_b["gpus"][1]["jobs"]] == [job.pk]
    assert sim_a["gpus"][2]["jobs"] == []
    Job.objects.filter(pk=job.pk).update(state="succeeded")
    GpuRelease.objects.all().delete()
    detail = outsider_api.get("/api/v1/nodes/sim-a/").json()
    assert detail["used"] == {"gpus": 0, "cpus": 0, "memory_mb": 0}


def test_stranger_cannot_list_nodes(stranger_api: Any, fleet_nodes: Any) -> None:
    assert stranger_api.get("/api/v1/nodes/").status_code == 403


def test_team_admin_edits_host_defaults_only(
    owner_api: Any, team_admin_api: Any, staff_api: Any, outsider_api: Any, team: Any
) -> None:
    shown = owner_api.get("/api/v1/teams/vision/").json()
    assert (shown["cpus_per_gpu"], shown["memory_mb_per_gpu"]) == (0, 0)
    body = team_admin_api.patch(
        "/api/v1/teams/vision/", {"cpus_per_gpu": 8, "memory_mb_per_gpu": 32_000}, format="json"
    )
    assert body.status_code == 200, body.json()
    team.refresh_from_db()
    assert (team.cpus_per_gpu, team.memory_mb_per_gpu) == (8, 32_000)
    mixed = team_admin_api.patch(
        "/api/v1/teams/vision/", {"cpus_per_gpu": 4, "gpu_limit": 99}, format="json"
    )
    assert mixed.status_code == 403 and "gpu_limit" in mixed.json()["message"]
    for api in (owner_api, outsider_api):
        response = api.patch("/api/v1/teams/vision/", {"cpus_per_gpu": 1}, format="json")
        assert response.status_code in (403, 404)
    team.refresh_from_db()
    assert team.cpus_per_gpu == 8 and team.gpu_limit == 16
    assert (
        staff_api.patch("/api/v1/teams/vision/", {"memory_mb_per_gpu": 0}, format="json").json()[
            "memory_mb_per_gpu"
        ]
        == 0
    )


@pytest.mark.parametrize(
    ("patch", "field", "needle"),
    [
        ({"cpus_per_gpu": 65}, "cpus_per_gpu", "the largest offers 64 CPU cores"),
        ({"memory_mb_per_gpu": 600_000}, "memory_mb_per_gpu", "largest offers 512000 MB"),
        ({"cpus_per_gpu": -1}, "cpus_per_gpu", "greater than or equal to 0"),
        ({"memory_mb_per_gpu": "lots"}, "memory_mb_per_gpu", "valid integer"),
    ],
)
def test_host_default_rejections(
    team_admin_api: Any, team: Any, fleet_nodes: Any, patch: dict[str, Any], field: str,
    needle: str,
) -> None:  # fmt: skip
    Node.objects.filter(name="sim-a").update(cpus=64, memory_mb=512_000)
    Node.objects.filter(name="sim-b").update(cpus=16, memory_mb=128_000)
    response = team_admin_api.patch("/api/v1/teams/vision/", patch, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["extra"]["fields"]
    assert needle in response.json()["message"], response.json()
    team.refresh_from_db()
    assert (team.cpus_per_gpu, team.memory_mb_per_gpu) == (0, 0)
    # Exactly what the largest node offers is fine.
    ok = team_admin_api.patch("/api/v1/teams/vision/", {"cpus_per_gpu": 64}, format="json")
    assert ok.status_code == 200 and ok.json()["cpus_per_gpu"] == 64


def test_node_list_queries_do_not_grow_with_jobs(
    owner: Any, team: Any, outsider_api: Any, fleet_nodes: Any, django_assert_max_num_queries: Any
) -> None:
    a, b = fleet_nodes

    def add_gang(index: int) -> None:
        job = Job.objects.create(
            owner=owner, team=team, name=f"g{index}", command="true", gpus=2, gpus_per_node=1,
            time_limit=60, state="running", node=a, gpu_indices=[index], attempt=1, cpus=1,
        )  # fmt: skip
        JobMember.objects.create(job=job, attempt=1, rank=0, node=a, gpu_indices=[index])
        JobMember.objects.create(job=job, attempt=1, rank=1, node=b, gpu_indices=[index % 2])

    add_gang(0)
    with django_assert_max_num_queries(12) as few:
        outsider_api.get("/api/v1/nodes/")
    for index in (1, 2, 3):
        add_gang(index)
    with django_assert_max_num_queries(len(few.captured_queries)):
        nodes = outsider_api.get("/api/v1/nodes/").json()
    assert [n["used"]["cpus"] for n in nodes] == [4, 4]


def test_team_admin_edits_idle_settings_staff_edit_host_limits(
    owner_api: Any, team_admin_api: Any, staff_api: Any, outsider_api: Any, team: Any
) -> None:
    shown = owner_api.get("/api/v1/teams/vision/").json()
    assert (shown["idle_util_percent"], shown["idle_minutes"], shown["idle_action"]) == (
        5.0,
        60,
        "warn",
    )
    assert (shown["cpu_limit"], shown["memory_mb_limit"]) == (None, None)
    idle = {"idle_util_percent": 12.5, "idle_minutes": 0, "idle_action": "stop"}
    body = team_admin_api.patch("/api/v1/teams/vision/", idle, format="json")
    assert body.status_code == 200, body.json()
    team.refresh_from_db()
    assert (team.idle_util_percent, team.idle_minutes, team.idle_action) == (12.5, 0, "stop")
    refused = team_admin_api.patch("/api/v1/teams/vision/", {"cpu_limit": 64}, format="json")
    assert refused.status_code == 403 and "cpu_limit" in refused.json()["message"]
    for api in (owner_api, outsider_api):
        response = api.patch("/api/v1/teams/vision/", {"idle_minutes": 5}, format="json")
        assert response.status_code in (403, 404)
    limits = {"cpu_limit": 64, "memory_mb_limit": 256_000}
    body = staff_api.patch("/api/v1/teams/vision/", limits, format="json")
    assert body.status_code == 200, body.json()
    assert (body.json()["cpu_limit"], body.json()["memory_mb_limit"]) == (64, 256_000)
    team.refresh_from_db()
    assert (team.cpu_limit, team.memory_mb_limit, team.idle_minutes) == (64, 256_000, 0)
    cleared = staff_api.patch("/api/v1/teams/vision/", {"cpu_limit": None}, format="json")
    assert cleared.json()["cpu_limit"] is None


@pytest.mark.parametrize(
    ("patch", "field", "needle"),
    [
        ({"idle_util_percent": 101}, "idle_util_percent", "less than or equal to 100"),
        ({"idle_util_percent": -1}, "idle_util_percent", "greater than or equal to 0"),
        ({"idle_util_percent": "NaN"}, "idle_util_percent", "valid number"),
        ({"idle_minutes": -5}, "idle_minutes", "greater than or equal to 0"),
        ({"idle_action": "kill"}, "idle_action", 'must be "warn"'),
        ({"cpu_limit": 0}, "cpu_limit", "greater than or equal to 1"),
        ({"memory_mb_limit": -1}, "memory_mb_limit", "greater than or equal to 1"),
        ({"cpu_limit": "many"}, "cpu_limit", "valid integer"),
    ],
)
def test_idle_and_host_limit_rejections(
    staff_api: Any, team: Any, patch: dict[str, Any], field: str, needle: str
) -> None:
    response = staff_api.patch("/api/v1/teams/vision/", patch, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["extra"]["fields"]
    assert needle in response.json()["message"], response.json()
    team.refresh_from_db()
    assert (team.idle_util_percent, team.idle_minutes, team.idle_action) == (5.0, 60, "warn")
    assert (team.cpu_limit, team.memory_mb_limit) == (None, None)


def test_team_update_checks_idle_and_limits_without_the_api(team: Any) -> None:
    from fleet.errors import ApplicationError
    from fleet.services.teams import team_update

    for data, needle in (
        ({"idle_util_percent": 150.0}, "between 0 and 100"),
        ({"idle_action": "pause"}, "warn (flag and notify) or stop"),
        ({"cpu_limit": 0}, "greater than 0"),
    ):
        with pytest.raises(ApplicationError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            team_update(team=team, data=data)
        team.refresh_from_db()
    assert (team.idle_util_percent, team.idle_action, team.cpu_limit) == (5.0, "warn", None)


def test_submit_above_the_teams_cpu_or_memory_limit_is_refused(owner_api: Any, team: Any) -> None:
    from tests.factories import GpuFactory

    for i in range(2):
        node = Node.objects.create(
            name=f"big-{i}", cpus=128, memory_mb=512_000, address=f"10.2.0.{i}"
        )
        for index in range(4):
            GpuFactory(node=node, index=index)
    team.cpu_limit, team.memory_mb_limit = 64, 200_000
    team.save(update_fields=["cpu_limit", "memory_mb_limit"])
    gang = {"name": "train", "command": "torchrun train.py", "nodes": 2, "gpus_per_node": 4}
    refused = owner_api.post("/api/v1/jobs/", {**gang, "cpus": 40}, format="json")
    assert refused.status_code == 400, refused.json()
    assert (
        "needs 80 CPU cores over all its nodes; team vision's limit is 64 CPU cores"
        in (refused.json()["message"])
    )
    heavy = owner_api.post("/api/v1/jobs/", {**gang, "memory_mb": 150_000}, format="json")
    assert heavy.status_code == 400
    assert "team vision's limit is 200000 MB" in heavy.json()["message"]
    assert list(refused.json()["extra"]["fields"]) == ["cpus"]
    assert list(heavy.json()["extra"]["fields"]) == ["memory_mb"]
    # One node alone: the team limit is checked there too.
    single = owner_api.post(
        "/api/v1/jobs/",
        {"name": "one", "command": "python t.py", "gpus": 4, "cpus": 65},
        format="json",
    )
    assert single.status_code == 400 and "limit is 64 CPU cores" in single.json()["message"]
    assert not Job.objects.exists()
    ok = owner_api.post("/api/v1/jobs/", {**gang, "cpus": 32}, format="json")
    assert ok.status_code == 201, ok.json()
