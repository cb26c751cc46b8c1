"""Job output: chunks shipped by agents, read through GET /api/v1/jobs/{id}/logs/."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from fleet.models import Job, JobLogChunk, Node
from fleet.services.agents import node_key_create
from fleet.services.job_reports import job_report_apply
from fleet.services.job_states import SCHEDULER, job_transition
from fleet.services.telemetry_logs import log_chunk_store
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def node() -> Node:
    return node_key_create(name="log-node")[0]


@pytest.fixture
def job(node: Node, owner: Any, team: Any) -> Job:
    job = JobFactory(owner=owner, team=team)
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [0]},
    )  # fmt: skip
    job_report_apply(node=node, job_id=job.pk, attempt=1, state="running", pid=5)
    return job


def store(
    node: Node, job: Job, offset: int, data: bytes, eof: bool = False, attempt: int = 1
) -> bool:
    return log_chunk_store(
        node=node, job_id=job.pk, attempt=attempt, offset=offset,
        data_b64=base64.b64encode(data).decode(), eof=eof,
    )  # fmt: skip


def read(api: Any, job: Job, offset: int = 0) -> Any:
    return api.get(f"/api/v1/jobs/{job.pk}/logs/", {"offset": offset})


def test_follow_a_running_job_then_read_to_the_end(node: Node, job: Job, owner_api: Any) -> None:
    text = "epoch 1 loss 0.9 — ok\n".encode()
    assert store(node, job, 0, text[:10])
    first = read(owner_api, job).json()
    assert first == {
        "data": text[:10].decode(), "offset": 0, "next_offset": 10, "complete": False,
        "attempt": 1, "rank": 0, "ranks": [0],
    }  # fmt: skip
    store(node, job, 10, text[10:])
    assert not store(node, job, 10, text[10:])  # a redelivered chunk is stored once
    second = read(owner_api, job, 10).json()
    assert second["data"] == text[10:].decode() and not second["complete"]
    store(node, job, len(text), b"", eof=True)
    job_report_apply(node=node, job_id=job.pk, attempt=1, state="succeeded")
    done = read(owner_api, job, len(text)).json()
    assert done == {
        "data": "", "offset": len(text), "next_offset": len(text), "complete": True, "attempt": 1,
        "rank": 0, "ranks": [0],
    }  # fmt: skip
    assert read(owner_api, job).json()["data"] == text.decode()


def test_a_read_never_splits_a_character_and_stops_at_a_gap(
    node: Node, job: Job, owner_api: Any
) -> None:
    text = "température\n".encode()  # "é" is two bytes
    cut = text.index("é".encode()) + 1
    store(node, job, 0, text[:cut])
    body = read(owner_api, job).json()
    assert body["data"] == "temp" and body["next_offset"] == cut - 1
    store(node, job, len(text) + 5, b"later")  # bytes in between still in transit
    store(node, job, cut, text[cut:])
    body = read(owner_api, job, body["next_offset"]).json()
    assert body["data"] == "érature\n" and body["next_offset"] == len(text)


def test_chunks_from_another_node_or_attempt_are_dropped(node: Node, job: Job) -> None:
    other = node_key_create(name="other-node")[0]
    assert not store(other, job, 0, b"forged")
    assert not store(node, job, 0, b"old", attempt=0)
    assert not JobLogChunk.objects.exists()


def test_output_is_capped(node: Node, job: Job, owner_api: Any, settings: Any) -> None:
    settings.FLEET_LOG_MAX_BYTES = 8
    store(node, job, 0, b"0123456789")
    assert not store(node, job, 10, b"more")
    assert read(owner_api, job).json()["data"] == "01234567"


@pytest.mark.parametrize(
    ("who", "status"),
    [
        ("owner_api", 200),
        ("team_admin_api", 200),
        ("staff_api", 200),
        ("teammate_api", 403),
        ("outsider_api", 403),
        ("stranger_api", 403),
        ("anon_api", 401),
    ],
)
def test_only_owner_team_admins_and_staff_read_logs(
    request: Any, node: Node, job: Job, who: str, status: int
) -> None:
    store(node, job, 0, b"secret output\n")
    response = read(request.getfixturevalue(who), job)
    assert response.status_code == status
    if status == 200:
        assert response.json()["data"] == "secret output\n"
    else:
        assert "secret" not in response.content.decode()


def test_output_of_long_finished_jobs_is_pruned(node: Node, job: Job, settings: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from fleet.services.telemetry_logs import log_prune

    store(node, job, 0, b"kept while the job is recent\n")
    job_report_apply(node=node, job_id=job.pk, attempt=1, state="succeeded", exit_code=0)
    settings.FLEET_LOG_RETENTION = 3600
    assert log_prune() == 0
    assert JobLogChunk.objects.filter(job=job).count() == 1
    assert log_prune(now=timezone.now() + timedelta(hours=2)) == 1
    assert not JobLogChunk.objects.filter(job=job).exists()
    assert Job.objects.filter(pk=job.pk, state="succeeded").exists()
