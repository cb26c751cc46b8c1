from __future__ import annotations

from typing import Any

import pytest

from fleet.models import Job, Node

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
