"""The lean single submit: the plain-Python check of a body, the answer built as a dict, the
job and its event in one statement, and token authentication in one query. Each gives what
the serializers and the ORM gave, or leaves the request to them."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIRequestFactory

from fleet.api.auth import HashedTokenAuthentication
from fleet.api.job_output import JobOutputSerializer
from fleet.api.job_submit import lean_values
from fleet.api.job_submitted import job_submitted
from fleet.api.jobs import JobListApi
from fleet.models import ApiToken, Job, JobEvent, JobState, Membership
from fleet.models.jobs import ActorKind
from fleet.services.access import memberships_of
from fleet.services.job_insert import job_insert_with_event
from fleet.services.tokens import token_rotate

pytestmark = pytest.mark.django_db

Input = JobListApi.InputSerializer
BASE = {"name": "train", "command": "python train.py"}

# Bodies the lean check vouches for: every field, bounds included.
PLAIN = [
    BASE,
    {**BASE, "gpus": 2, "time_limit": 600, "priority": -5, "qos": "high", "preemptible": True},
    {**BASE, "gpus": 0, "gpu_memory_mb": 1, "gpu_compute_percent": 100, "gpu_model": ""},
    {**BASE, "gpus": 1024, "gpus_per_node": 8, "nodes": 1024, "same_group": False},
    {**BASE, "env": {"A": "", "B": " x "}, "workdir": "", "team": "vision", "cpus": 0},
    {**BASE, "memory_mb": 2**31 - 1, "max_requeues": 100, "min_gpu_memory_mb": 1},
    {**BASE, "name": "n" * 200, "command": "  echo  ", "env": {}},
    {**BASE, "name": "  ", "gpu_model": "a100-80gb", "qos": "low"},
    {**BASE, "name": "é ü 模型"},
]
# Bodies it leaves to the serializer: an error, or a value the serializer converts.
OTHER: list[Any] = [
    [],
    "text",
    {"name": "train"},
    {"command": "x"},
    {**BASE, "gpus": "2"},
    {**BASE, "gpus": 2.0},
    {**BASE, "gpus": True},
    {**BASE, "gpus": None},
    {**BASE, "gpus": -1},
    {**BASE, "gpus": 1025},
    {**BASE, "time_limit": 0},
    {**BASE, "time_limit": 2**31},
    {**BASE, "priority": 10**6},
    {**BASE, "preemptible": "true"},
    {**BASE, "preemptible": 1},
    {**BASE, "qos": "urgent"},
    {**BASE, "qos": None},
    {**BASE, "name": ""},
    {**BASE, "name": "n" * 201},
    {**BASE, "name": 5},
    {**BASE, "name": "a\x00b"},
    {**BASE, "command": "echo \ud800"},
    {**BASE, "team": ""},
    {**BASE, "team": "t" * 51},
    {**BASE, "env": []},
    {**BASE, "env": {"A": 1}},
    {**BASE, "env": {"A": None}},
    {**BASE, "env": {"A": "x\x00"}},
    {**BASE, "workdir": "w" * 1001},
    {**BASE, "unknown": 1},
    {**BASE, "array": 4},
]


@pytest.mark.parametrize("body", PLAIN)
def test_lean_check_gives_what_the_serializer_gives(body: dict[str, Any]) -> None:
    serializer = Input(data=body)
    assert serializer.is_valid(), serializer.errors
    assert lean_values(Input, body) == dict(serializer.validated_data)


@pytest.mark.parametrize("body", OTHER)
def test_lean_check_leaves_the_rest_to_the_serializer(body: Any) -> None:
    assert lean_values(Input, body) is None


def _shown(job: Job, user: Any) -> Any:
    """The job as JobOutputSerializer shows it to `user`, as JSON."""
    data = JobOutputSerializer(job, context={"request": SimpleNamespace(user=user)}).data
    return json.loads(JSONRenderer().render(data))


@pytest.mark.parametrize(
    "body",
    [
        BASE,
        {**BASE, "gpus": 2, "env": {"SEED": "1"}, "workdir": "/data", "priority": 3},
        {**BASE, "gpus": 0, "gpu_memory_mb": 4096, "gpu_compute_percent": 25},
        {**BASE, "gpus": 4, "gpus_per_node": 2, "nodes": 2, "same_group": True},
        {**BASE, "gpus": "1", "qos": "low", "preemptible": "yes"},  # through the serializer
    ],
)
def test_submit_answers_as_the_job_serializer_shows_the_job(
    owner: Any, owner_api: Any, body: dict[str, Any]
) -> None:
    response = owner_api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    job = Job.objects.select_related("owner", "team").get(pk=response.json()["id"])
    assert response.content == JSONRenderer().render(_shown(job, owner))


def test_the_answer_as_others_would_see_it(owner_api: Any, teammate: Any, staff: Any) -> None:
    job_id = owner_api.post("/api/v1/jobs/", {**BASE, "env": {"K": "v"}}, format="json").json()[
        "id"
    ]
    job = Job.objects.select_related("owner", "team").get(pk=job_id)
    for user in (teammate, staff):
        assert json.loads(JSONRenderer().render(job_submitted(job, user))) == _shown(job, user)


def test_a_started_job_is_left_to_the_serializer(owner: Any, owner_api: Any) -> None:
    job_id = owner_api.post("/api/v1/jobs/", BASE, format="json").json()["id"]
    Job.objects.filter(pk=job_id).update(state=JobState.RUNNING, attempt=1)
    assert job_submitted(Job.objects.get(pk=job_id), owner) is None


def test_job_and_event_are_written_together(owner: Any, team: Any) -> None:
    job = Job(owner=owner, team=team, name="j", command="c", time_limit=60)
    event = JobEvent(
        from_state="", to_state=JobState.PENDING, attempt=0, reason="submitted",
        actor_kind=ActorKind.USER, actor="owner",
    )  # fmt: skip
    job_insert_with_event(job=job, event=event)
    stored = Job.objects.get(pk=job.pk)
    assert (stored.submitted_at, stored.state, stored.env) == (job.submitted_at, "pending", {})
    assert list(JobEvent.objects.filter(job=stored).values_list("id", "reason")) == [
        (event.pk, "submitted")
    ]


def test_a_refused_job_leaves_no_event(owner: Any, team: Any) -> None:
    before = JobEvent.objects.count()
    job = Job(owner=owner, team=team, name="j", command="c", time_limit=0)  # check fails
    event = JobEvent(from_state="", to_state=JobState.PENDING, attempt=0, actor_kind="user")
    with pytest.raises(IntegrityError), transaction.atomic():
        job_insert_with_event(job=job, event=event)
    assert (Job.objects.count(), JobEvent.objects.count()) == (0, before)


def _auth(key: str) -> Any:
    request = APIRequestFactory().get("/api/v1/me/", HTTP_AUTHORIZATION=f"Token {key}")
    return HashedTokenAuthentication().authenticate(request)


def test_token_user_and_memberships_are_read_in_one_query(owner: Any, team: Any) -> None:
    key = token_rotate(user=owner)
    ApiToken.objects.filter(user=owner).update(last_used_at=None)
    _auth(key)  # writes last_used_at
    with CaptureQueriesContext(connection) as queries:
        user, token = _auth(key)
        teams = [m.team.slug for m in memberships_of(user)]
    assert len(queries.captured_queries) == 1
    assert (user.pk, token.user_id, teams) == (owner.pk, owner.pk, ["vision"])


def test_revoked_tokens_stop_working_at_once(owner: Any, team: Any) -> None:
    from rest_framework.test import APIClient

    api = APIClient()
    key = token_rotate(user=owner)
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/v1/jobs/").status_code == 200

    new_key = token_rotate(user=owner)  # the old key is replaced
    assert api.get("/api/v1/jobs/").status_code == 401
    api.credentials(HTTP_AUTHORIZATION=f"Token {new_key}")
    assert api.get("/api/v1/jobs/").status_code == 200

    Membership.objects.filter(user=owner).delete()  # no team left: the fleet is closed
    assert api.post("/api/v1/jobs/", BASE, format="json").status_code == 403
    Membership.objects.create(user=owner, team=team, is_default=True)
    assert api.post("/api/v1/jobs/", BASE, format="json").status_code == 201

    owner.is_active = False
    owner.save(update_fields=["is_active"])
    assert api.get("/api/v1/jobs/").status_code == 401
    owner.is_active = True
    owner.save(update_fields=["is_active"])
    assert api.get("/api/v1/jobs/").status_code == 200

    ApiToken.objects.filter(user=owner).delete()
    response = api.get("/api/v1/jobs/")
    assert response.status_code == 401
    assert response.json()["message"].startswith("Invalid token")
