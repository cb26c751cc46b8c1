from __future__ import annotations

from typing import Any

import pytest

from fleet.models import Job, JobEvent, JobState

pytestmark = pytest.mark.django_db

SUBMIT = "/api/v1/jobs/"


def _submit(api: Any, **overrides: Any) -> Any:
    body = {"name": "train", "command": "python train.py", "gpus": 1, **overrides}
    return api.post(SUBMIT, body, format="json")


def test_submit_creates_a_pending_job_with_its_first_event(owner_api: Any, team: Any) -> None:
    response = _submit(owner_api, env={"LR": "0.1"}, time_limit=600)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "pending" and body["team"] == "vision" and body["owner"] == "owner"
    assert body["env"] == {"LR": "0.1"} and body["time_limit"] == 600
    assert JobEvent.objects.filter(job_id=body["id"], to_state="pending").count() == 1


def test_submit_uses_the_team_default_time_limit(owner_api: Any, team: Any) -> None:
    assert _submit(owner_api).json()["time_limit"] == team.default_time_limit


def test_fractional_submit(owner_api: Any, fleet_nodes: Any) -> None:
    body = _submit(owner_api, gpus=0, gpu_memory_mb=8000, gpu_compute_percent=25).json()
    assert (body["gpus"], body["gpu_memory_mb"], body["gpu_compute_percent"]) == (0, 8000, 25)


@pytest.mark.parametrize(
    ("overrides", "field", "needle"),
    [
        ({"gpus": 0}, "gpus", "at least one whole GPU"),
        ({"gpus": 2, "gpu_memory_mb": 100, "gpu_compute_percent": 10}, "gpus", "not both"),
        ({"gpus": 8}, "gpus", "needs 8 GPUs on one node; the largest node has 4"),
        ({"gpu_model": "H100"}, "gpu_model", "No node has GPU model 'H100'"),
        ({"gpus": 3, "gpu_model": "V100-32GB"}, "gpus", "the largest node has 2"),
        ({"gpus": 0, "gpu_memory_mb": 90000, "gpu_compute_percent": 10}, "gpu_memory_mb", "the largest GPU has 81920 MB"),
        ({"min_gpu_memory_mb": 100000}, "min_gpu_memory_mb", "the largest GPU has 81920 MB"),
        ({"time_limit": 90000}, "time_limit", "over team vision's maximum of 86400 s"),
        ({"team": "speech"}, "team", "not a member of team 'speech'"),
        ({"env": {"1BAD": "x"}}, "env", "'1BAD' is not a valid environment variable name"),
        ({"env": {"FLEET_JOB_ID": "x"}}, "env", "set by fleet for every job"),
        ({"env": {"K": "x" * 40000}}, "env", "at most 32768 bytes"),
        ({"env": {f"V{i}": "x" for i in range(200)}}, "env", "at most 128 allowed"),
        ({"command": "x" * 20000}, "command", "at most 16384 allowed"),
        ({"command": "   "}, "command", ""),
        ({"priority": 1000}, "priority", "less than or equal to 100"),
        ({"gpus": 20}, "gpus", "hard limit is 16 GPUs"),
    ],
)  # fmt: skip
def test_submit_rejections_say_what_to_do(
    owner_api: Any,
    fleet_nodes: Any,
    other_team: Any,
    overrides: dict[str, Any],
    field: str,
    needle: str,
) -> None:
    response = _submit(owner_api, **overrides)
    assert response.status_code == 400, response.json()
    body = response.json()
    assert set(body) == {"message", "extra"}
    assert field in body["extra"]["fields"]
    assert needle in body["message"]
    assert not Job.objects.exists()


def test_user_cap_rejects_requests_over_it(owner_api: Any, team: Any) -> None:
    team.user_gpu_cap = 2
    team.save()
    response = _submit(owner_api, gpus=4)
    assert response.status_code == 400
    assert "caps each member at 2" in response.json()["message"]


def test_several_teams_need_an_explicit_choice(owner: Any, owner_api: Any, other_team: Any) -> None:
    from fleet.models import Membership

    Membership.objects.create(user=owner, team=other_team)  # not default
    assert _submit(owner_api).json()["team"] == "vision"
    assert _submit(owner_api, team="speech").json()["team"] == "speech"


def test_list_filters_and_pagination(owner_api: Any, teammate_api: Any) -> None:
    for _ in range(3):
        _submit(owner_api)
    _submit(teammate_api)
    everything = owner_api.get(SUBMIT).json()
    assert everything["count"] == 4
    assert owner_api.get(SUBMIT, {"mine": "1"}).json()["count"] == 3
    assert owner_api.get(SUBMIT, {"owner": "teammate"}).json()["count"] == 1
    assert owner_api.get(SUBMIT, {"state": "running"}).json()["count"] == 0
    assert owner_api.get(SUBMIT, {"team": "vision"}).json()["count"] == 4
    page = owner_api.get(SUBMIT, {"page_size": 2, "ordering": "id"}).json()
    assert len(page["results"]) == 2 and page["next"]
    assert page["results"][0]["id"] < page["results"][1]["id"]


def test_other_teams_see_metadata_but_not_env_or_command(owner_api: Any, outsider_api: Any) -> None:
    job_id = _submit(owner_api, env={"SECRET": "s3cret"}).json()["id"]
    seen = outsider_api.get(f"{SUBMIT}{job_id}/").json()
    assert seen["name"] == "train" and seen["state"] == "pending"
    assert seen["env"] is None and seen["command"] is None and seen["can_manage"] is False
    listed = outsider_api.get(SUBMIT).json()["results"][0]
    assert listed["env"] is None


def test_teammates_see_the_command_but_not_env(owner_api: Any, teammate_api: Any) -> None:
    job_id = _submit(owner_api, env={"SECRET": "s3cret"}).json()["id"]
    seen = teammate_api.get(f"{SUBMIT}{job_id}/").json()
    assert seen["command"] == "python train.py" and seen["env"] is None


@pytest.mark.parametrize("who", ["owner_api", "team_admin_api", "staff_api"])
def test_owner_team_admin_and_staff_may_cancel(request: Any, owner_api: Any, who: str) -> None:
    job_id = _submit(owner_api).json()["id"]
    api = request.getfixturevalue(who)
    response = api.post(f"{SUBMIT}{job_id}/cancel/", {"reason": "no longer needed"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "cancelled"
    assert response.json()["state_reason"] == "no longer needed"


@pytest.mark.parametrize("action", ["cancel", "hold", "release", "requeue"])
@pytest.mark.parametrize("who", ["teammate_api", "outsider_api"])
def test_others_may_not_act_on_a_job(request: Any, owner_api: Any, who: str, action: str) -> None:
    job_id = _submit(owner_api).json()["id"]
    response = request.getfixturevalue(who).post(f"{SUBMIT}{job_id}/{action}/")
    assert response.status_code == 403
    assert "Only the job's owner" in response.json()["message"]
    assert Job.objects.get(id=job_id).state == JobState.PENDING


def test_hold_release_and_refusals(owner_api: Any) -> None:
    job_id = _submit(owner_api).json()["id"]
    assert owner_api.post(f"{SUBMIT}{job_id}/hold/").json()["state"] == "held"
    refused = owner_api.post(f"{SUBMIT}{job_id}/hold/")
    assert refused.status_code == 409
    assert refused.json()["message"] == f"Job {job_id} is held; hold applies only to pending jobs."
    assert owner_api.post(f"{SUBMIT}{job_id}/release/").json()["state"] == "pending"
    assert owner_api.post(f"{SUBMIT}{job_id}/requeue/").status_code == 409


def test_cancel_of_a_running_job_tells_its_node(
    owner_api: Any, fleet_nodes: Any, sent: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from fleet.services import messaging

    job_id = _submit(owner_api).json()["id"]
    Job.objects.filter(id=job_id).update(
        state="running", attempt=2, node=fleet_nodes[0], gpu_indices=[1]
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = owner_api.post(f"{SUBMIT}{job_id}/cancel/")
    assert response.status_code == 200
    stops = [s for s in sent if s[0] == messaging.STOP_JOB_TASK]
    assert stops == [
        (
            messaging.STOP_JOB_TASK,
            "node.sim-a",
            {"job_id": job_id, "attempt": 2, "reason": "cancelled by owner"},
        )
    ]


def test_events_endpoint(owner_api: Any) -> None:
    job_id = _submit(owner_api).json()["id"]
    owner_api.post(f"{SUBMIT}{job_id}/hold/")
    events = owner_api.get(f"{SUBMIT}{job_id}/events/").json()
    assert [(e["from_state"], e["to_state"]) for e in events] == [
        ("", "pending"),
        ("pending", "held"),
    ]
    assert events[1]["actor"] == "owner"


def test_unknown_job_is_404_with_the_error_shape(owner_api: Any) -> None:
    response = owner_api.get(f"{SUBMIT}424242/")
    assert response.status_code == 404
    assert response.json() == {"message": "Job 424242 does not exist.", "extra": {}}
