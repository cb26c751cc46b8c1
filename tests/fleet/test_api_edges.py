"""The API's edges: every error is JSON in one shape, input is bounded and strict, and
another team's view of a job keeps its owner's paths out of the reasons."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from fleet.models import Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _shaped(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = json.loads(response.content)
    assert set(body) == {"message", "extra"} and body["message"]
    return body


def _fields(response: Any) -> dict[str, Any]:
    return _shaped(response, 400)["extra"]["fields"]


# --- every error is JSON -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/jobs/abc/", "/api/v1/jobs/-1/", "/api/v1/nothing/"])
@pytest.mark.parametrize("debug", [False, True])
def test_a_path_that_matches_no_route_is_a_json_404(
    owner_api: APIClient, settings: Any, path: str, debug: bool
) -> None:
    settings.DEBUG = debug
    body = _shaped(owner_api.get(path), 404)
    assert path in body["message"]


def test_a_missing_job_is_a_json_404(owner_api: APIClient) -> None:
    assert _shaped(owner_api.get("/api/v1/jobs/987654/"), 404)["message"] == (
        "Job 987654 does not exist."
    )


def test_a_body_over_the_upload_limit_is_a_json_413(owner_api: APIClient, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = {"name": "big", "command": "x" * 2000}
    response = owner_api.post("/api/v1/jobs/", body, format="json")
    assert "1000 bytes" in _shaped(response, 413)["message"]
    assert not Job.objects.exists()


def test_method_not_allowed_is_json(owner_api: APIClient) -> None:
    response = owner_api.delete("/api/v1/jobs/")
    assert "DELETE" in _shaped(response, 405)["message"]
    assert "GET" in response["Allow"]


def test_an_unsupported_accept_header_is_a_json_406(owner_api: APIClient) -> None:
    _shaped(owner_api.get("/api/v1/nodes/", HTTP_ACCEPT="text/html"), 406)


def test_a_body_that_is_not_json_is_a_json_415(owner_api: APIClient) -> None:
    response = owner_api.post("/api/v1/jobs/", "name=a", content_type="text/plain")
    assert "text/plain" in _shaped(response, 415)["message"]


def test_a_malformed_json_body_is_a_json_400(owner_api: APIClient) -> None:
    response = owner_api.post("/api/v1/jobs/", "{not json", content_type="application/json")
    _shaped(response, 400)


@pytest.mark.parametrize("debug", [False, True])
def test_a_server_error_under_the_api_is_json_without_details(
    owner: Any, monkeypatch: Any, settings: Any, debug: bool
) -> None:
    settings.DEBUG = debug

    def boom() -> None:
        raise RuntimeError("redis://:hunter2@broker:6379/0")

    monkeypatch.setattr("fleet.api.nodes.node_list", boom)
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(owner)
    response = client.get("/api/v1/nodes/")
    body = _shaped(response, 500)
    assert body["extra"] == {} and "hunter2" not in response.content.decode()


# --- development mode: technical pages for staff only ----------------------------------------


def _page_that_fails(monkeypatch: Any) -> None:
    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("redis://:hunter2@broker:6379/0")

    monkeypatch.setattr("fleet.web.views.token.render", boom)


@pytest.mark.parametrize("debug", [False, True])
def test_a_page_500_never_shows_settings_to_a_member(
    client: Any, owner: Any, monkeypatch: Any, settings: Any, debug: bool
) -> None:
    settings.DEBUG = debug
    _page_that_fails(monkeypatch)
    client.raise_request_exception = False
    client.force_login(owner)
    response = client.get("/token/")
    html = response.content.decode()
    assert response.status_code == 500
    assert "hunter2" not in html and "SECRET_KEY" not in html and "Server error" in html


def test_in_development_mode_staff_see_the_technical_500_page(
    client: Any, staff: Any, monkeypatch: Any, settings: Any
) -> None:
    settings.DEBUG = True
    _page_that_fails(monkeypatch)
    client.raise_request_exception = False
    client.force_login(staff)
    response = client.get("/token/")
    assert response.status_code == 500 and "hunter2" in response.content.decode()


def test_in_development_mode_a_missing_page_is_plain_for_members_technical_for_staff(
    client: Any, owner: Any, staff: Any, settings: Any
) -> None:
    settings.DEBUG = True
    client.force_login(owner)
    plain = client.get("/no-such-page/")
    assert plain.status_code == 404 and "URLconf" not in plain.content.decode()
    assert "/no-such-page/" in plain.content.decode()
    client.force_login(staff)
    technical = client.get("/no-such-page/")
    assert technical.status_code == 404 and "URLconf" in technical.content.decode()


# --- integers the database holds, strict types, unknown fields -------------------------------


@pytest.mark.parametrize("field", ["max_time_limit", "guaranteed_gpus", "gpu_limit"])
def test_a_team_integer_too_big_for_its_column_is_a_400_naming_it(
    staff_api: APIClient, team: Any, field: str
) -> None:
    response = staff_api.patch("/api/v1/teams/vision/", {field: 10**30}, format="json")
    assert field in _fields(response)
    team.refresh_from_db()
    assert team.guaranteed_gpus == 0


@pytest.mark.parametrize(
    "field", ["gpu_memory_mb", "min_gpu_memory_mb", "time_limit", "priority", "gpus"]
)
def test_a_job_integer_out_of_range_is_a_400_naming_it(
    owner_api: APIClient, fleet_nodes: Any, field: str
) -> None:
    response = owner_api.post(
        "/api/v1/jobs/", {"name": "a", "command": "true", field: 10**30}, format="json"
    )
    assert field in _fields(response)
    assert not Job.objects.exists()


def test_env_values_must_be_strings(owner_api: APIClient, fleet_nodes: Any) -> None:
    response = owner_api.post(
        "/api/v1/jobs/", {"name": "a", "command": "true", "env": {"A": 5}}, format="json"
    )
    assert "env" in _fields(response)
    assert not Job.objects.exists()


def test_unknown_fields_in_a_patch_are_named(staff_api: APIClient, team: Any) -> None:
    response = staff_api.patch("/api/v1/teams/vision/", {"gpu_limt": 3, "name": "V"}, format="json")
    assert "gpu_limt" in _fields(response) and "gpu_limt" in response.json()["message"]
    team.refresh_from_db()
    assert team.name == "Vision"


def test_unknown_fields_in_a_submission_are_named(owner_api: APIClient, fleet_nodes: Any) -> None:
    response = owner_api.post(
        "/api/v1/jobs/", {"name": "a", "command": "true", "gpu": 2}, format="json"
    )
    assert "gpu" in _fields(response)
    assert not Job.objects.exists()


def test_a_body_on_an_action_without_one_names_its_fields(
    owner_api: APIClient, fleet_nodes: Any
) -> None:
    job = owner_api.post("/api/v1/jobs/", {"name": "a", "command": "true"}, format="json").json()
    response = owner_api.post(f"/api/v1/jobs/{job['id']}/cancel/", {"why": "x"}, format="json")
    assert "why" in _fields(response)


# --- query parameters ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "param"),
    [
        ("/api/v1/queue/?limit=abc", "limit"),
        ("/api/v1/queue/?limit=99999999", "limit"),
        ("/api/v1/queue/?mine=1&mine=1", "mine"),
        ("/api/v1/queue/?mine=maybe", "mine"),
        ("/api/v1/queue/?tema=vision", "tema"),
        ("/api/v1/jobs/?mine=1&mine=0", "mine"),
        ("/api/v1/jobs/?mine=perhaps", "mine"),
        ("/api/v1/jobs/?stat=running", "stat"),
        ("/api/v1/jobs/?ordering=password", "ordering"),
        ("/api/v1/jobs/?page_size=abc", "page_size"),
        ("/api/v1/jobs/?page=abc", "page"),
        ("/api/v1/nodes/?sort=name", "sort"),
        ("/api/v1/nodes/sim-a/telemetry/?gpu=99", "gpu"),
        ("/api/v1/nodes/sim-a/telemetry/?gpu=1&gpu=2", "gpu"),
        ("/api/v1/nodes/sim-a/telemetry/?until=0001-01-01T00:00:00Z", "until"),
        (f"/api/v1/jobs/{{job}}/logs/?attempt={2**70}", "attempt"),
        ("/api/v1/jobs/{job}/logs/?ofset=3", "ofset"),
    ],
)  # fmt: skip
def test_bad_query_parameters_are_a_400_naming_them(
    owner_api: APIClient, fleet_nodes: Any, url: str, param: str
) -> None:
    job = owner_api.post("/api/v1/jobs/", {"name": "a", "command": "true"}, format="json").json()
    response = owner_api.get(url.format(job=job["id"]))
    assert param in _fields(response)


def test_good_query_parameters_still_work(owner_api: APIClient, fleet_nodes: Any) -> None:
    owner_api.post("/api/v1/jobs/", {"name": "a", "command": "true"}, format="json")
    assert owner_api.get("/api/v1/queue/?mine=1&limit=10").json()["pending_count"] == 1
    jobs = owner_api.get("/api/v1/jobs/?mine=true&state=pending&state=held&ordering=-id")
    assert jobs.json()["count"] == 1
    assert owner_api.get("/api/v1/nodes/sim-a/telemetry/?gpu=3").status_code == 200


# --- state_reason across teams ---------------------------------------------------------------

WORKDIR = "/home/owner/secret-project"
REASON = f"cannot enter the working directory {WORKDIR}: No such file or directory"


@pytest.fixture
def failed_job(owner: Any, team: Any) -> Job:
    return JobFactory(
        owner=owner,
        team=team,
        workdir=WORKDIR,
        command="python /opt/private/train.py --token abcdef",
        env={"WANDB_KEY": "wandb-secret-value"},
        state="failed",
        state_reason=REASON,
    )


def test_another_team_sees_the_reason_without_the_owners_paths(
    outsider_api: APIClient, failed_job: Job
) -> None:
    shown = outsider_api.get(f"/api/v1/jobs/{failed_job.pk}/").json()["state_reason"]
    assert "secret-project" not in shown and "/home/owner" not in shown
    assert shown.startswith("cannot enter the working directory") and "No such file" in shown
    listed = outsider_api.get("/api/v1/jobs/").json()["results"][0]["state_reason"]
    assert listed == shown


def test_another_team_sees_event_reasons_without_private_details(
    outsider_api: APIClient, failed_job: Job
) -> None:
    failed_job.events.create(
        from_state="running",
        to_state="failed",
        attempt=1,
        actor_kind="node",
        reason=f"{REASON}; command python /opt/private/train.py --token abcdef, "
        "key wandb-secret-value",
    )
    reasons = [
        e["reason"] for e in outsider_api.get(f"/api/v1/jobs/{failed_job.pk}/events/").json()
    ]
    text = " ".join(reasons)
    assert "secret-project" not in text and "/opt/private" not in text
    assert "wandb-secret-value" not in text and "abcdef" not in text


def test_the_jobs_team_and_staff_see_the_reason_whole(
    teammate_api: APIClient, staff_api: APIClient, failed_job: Job
) -> None:
    for api in (teammate_api, staff_api):
        assert api.get(f"/api/v1/jobs/{failed_job.pk}/").json()["state_reason"] == REASON


def test_another_team_sees_scheduler_reasons_unchanged(
    outsider_api: APIClient, owner: Any, team: Any
) -> None:
    job = JobFactory(owner=owner, team=team, state_reason="needs 4 GPUs on one node; 2/8 free")
    shown = outsider_api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert shown["state_reason"] == "needs 4 GPUs on one node; 2/8 free"
    queued = outsider_api.get("/api/v1/queue/").json()["pending"][0]["pending_reason"]
    assert queued == "needs 4 GPUs on one node; 2/8 free"


def test_a_length_limit_counts_what_was_sent_blanks_included(
    staff_api: APIClient, fleet_nodes: Any
) -> None:
    reason = " " * 10 + "x" * 495  # 505 characters; 495 once trimmed
    response = staff_api.post("/api/v1/nodes/sim-a/drain/", {"reason": reason}, format="json")
    assert "reason" in _fields(response)


def test_an_empty_query_value_is_a_bad_value_not_a_missing_one(
    owner_api: APIClient, fleet_nodes: Any
) -> None:
    assert "until" in _fields(owner_api.get("/api/v1/nodes/sim-a/telemetry/?until="))


def test_api_errors_carry_the_security_headers(owner_api: APIClient) -> None:
    response = owner_api.get("/api/v1/jobs/abc/")
    assert response["X-Content-Type-Options"] == "nosniff"
