"""Control side of the checkpoint convention: an agent's start report says whether the
attempt resumed from a checkpoint; fleet records it in the start's job event (no
migration), checks the value, and shows it as `resumed` in the job's REST detail and on the
job page."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from fleet import tasks
from fleet.models import Job, JobEvent, Node
from fleet.services.agents import agent_register, node_key_create
from fleet.services.job_batches import Dispatch, job_dispatch_starts
from fleet.services.job_reports import job_report_apply
from fleet.services.job_states import SCHEDULER, Actor, job_transition
from tests.factories import GpuFactory, JobFactory
from workers.wire import Signer

pytestmark = pytest.mark.django_db

REPORT = "fleet.tasks.job_report"
A100 = {"model": "A100-80GB", "memory_total_mb": 81920, "name": "Simulated A100"}


@pytest.fixture
def node_key() -> tuple[Node, str]:
    node, key = node_key_create(name="gpu-01")
    gpus = [{"index": i, "uuid": f"G{i}", **A100} for i in range(2)]
    agent_register(node=node, backend="simulated", agent_version="1", gpus=gpus)
    return Node.objects.get(pk=node.pk), key


def assigned(node: Node, owner: Any, team: Any) -> Job:
    job = JobFactory(owner=owner, team=team, preemptible=True, max_requeues=3)
    return job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [0]},
    )  # fmt: skip


def report(node_key: tuple[Node, str], job: Job, state: str, **args: Any) -> None:
    """The agent's report as it arrives: signed, through the control task."""
    node, key = node_key
    args = {"job_id": job.pk, "attempt": job.attempt, "state": state, "pid": 77, **args}
    tasks.job_report.run(**Signer(key).seal(REPORT, node.name, args, 60))


def start_reason(job: Job, attempt: int = 1) -> str:
    return JobEvent.objects.get(job=job, attempt=attempt, to_state="running", applied=True).reason


def page(user: Any, job: Job) -> str:
    browser = Client()
    browser.force_login(user)
    return browser.get(f"/jobs/{job.pk}/").content.decode()


def test_a_resumed_start_is_recorded_and_shown(
    node_key: tuple[Node, str], owner: Any, team: Any, owner_api: Any
) -> None:
    job = assigned(node_key[0], owner, team)

    report(node_key, job, "running", resumed=True)

    assert Job.objects.get(pk=job.pk).state == "running"
    assert start_reason(job) == "attempt 1 resumed from a checkpoint"
    assert owner_api.get(f"/api/v1/jobs/{job.pk}/").json()["resumed"] is True
    assert "attempt 1 resumed from checkpoint" in page(owner, job)


def test_a_fresh_start_says_so_and_shows_no_badge(
    node_key: tuple[Node, str], owner: Any, team: Any, owner_api: Any
) -> None:
    job = assigned(node_key[0], owner, team)

    report(node_key, job, "running", resumed=False)

    assert start_reason(job) == "attempt 1 started fresh"
    assert owner_api.get(f"/api/v1/jobs/{job.pk}/").json()["resumed"] is False
    assert 'id="job-resumed"' not in page(owner, job)


def test_an_agent_that_does_not_say_leaves_resumed_null(
    node_key: tuple[Node, str], owner: Any, team: Any, owner_api: Any
) -> None:
    job = assigned(node_key[0], owner, team)
    assert owner_api.get(f"/api/v1/jobs/{job.pk}/").json()["resumed"] is None

    report(node_key, job, "running")

    assert start_reason(job) == ""
    assert owner_api.get(f"/api/v1/jobs/{job.pk}/").json()["resumed"] is None


def test_a_resumed_that_is_not_true_or_false_is_left_out_and_the_start_still_applies(
    node_key: tuple[Node, str], owner: Any, team: Any, owner_api: Any, caplog: Any
) -> None:
    job = assigned(node_key[0], owner, team)

    with caplog.at_level(logging.WARNING, logger="fleet.services.job_reports"):
        report(node_key, job, "running", resumed="yes")

    assert Job.objects.get(pk=job.pk).state == "running"
    assert start_reason(job) == ""
    assert "reported resumed='yes'" in caplog.text and "not true or false" in caplog.text
    assert owner_api.get(f"/api/v1/jobs/{job.pk}/").json()["resumed"] is None


def test_duplicate_and_stale_reports_record_nothing_more(
    node_key: tuple[Node, str], owner: Any, team: Any
) -> None:
    node = node_key[0]
    job = assigned(node, owner, team)
    report(node_key, job, "running", resumed=False)
    report(node_key, job, "running", resumed=True)  # redelivered, and lying
    notes = JobEvent.objects.filter(job=job, reason__contains="attempt 1 ")
    assert list(notes.values_list("reason", flat=True)) == ["attempt 1 started fresh"]

    job_transition(job_id=job.pk, action="preempt", actor=SCHEDULER, reason="reclaimed", attempt=1)
    again = job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [1]},
    )  # fmt: skip
    stale = job_report_apply(
        node=node, job_id=job.pk, attempt=1, state="running", pid=5, resumed=True
    )
    assert stale is False
    assert not JobEvent.objects.filter(job=job, reason__contains="resumed").exists()
    report(node_key, again, "running", resumed=True)
    assert start_reason(job, attempt=2) == "attempt 2 resumed from a checkpoint"


def test_a_late_start_carries_how_it_started(
    node_key: tuple[Node, str], owner: Any, team: Any
) -> None:
    job = assigned(node_key[0], owner, team)

    report(node_key, job, "succeeded", exit_code=0, resumed=True)

    assert Job.objects.get(pk=job.pk).state == "succeeded"
    assert start_reason(job) == (
        "running (its start report came later); attempt 1 resumed from a checkpoint"
    )


def test_only_a_nodes_word_counts_and_a_requeued_job_shows_none(
    node_key: tuple[Node, str], owner: Any, team: Any, owner_api: Any
) -> None:
    job = assigned(node_key[0], owner, team)
    report(node_key, job, "running", resumed=False)
    job_transition(
        job_id=job.pk, action="cancel", actor=Actor.user(owner),
        reason="attempt 1 resumed from a checkpoint", attempt=1,
    )  # fmt: skip
    # How its last attempt started, whatever a person wrote.
    assert owner_api.get(f"/api/v1/jobs/{job.pk}/").json()["resumed"] is False
    assert 'id="job-resumed"' not in page(owner, job)

    other = assigned(node_key[0], owner, team)
    report(node_key, other, "running", resumed=True)
    job_transition(
        job_id=other.pk, action="preempt", actor=SCHEDULER, reason="reclaimed", attempt=1
    )
    assert owner_api.get(f"/api/v1/jobs/{other.pk}/").json()["resumed"] is None  # waits again


def test_each_member_of_a_multi_node_attempt_says_how_it_started(
    owner: Any, team: Any, owner_api: Any
) -> None:
    hosts = []
    for name in ("gpu-1", "gpu-2"):
        host = Node.objects.create(name=name, address=f"10.0.0.{len(hosts) + 1}")
        for i in range(4):
            GpuFactory(node=host, index=i, model="A100-80GB", memory_mb=81920)
        hosts.append(host)
    job: Any = JobFactory(owner=owner, team=team, gpus=8, gpus_per_node=4)
    (start,) = job_dispatch_starts(
        dispatches=[
            Dispatch(job.pk, 0, hosts[0].pk, (0, 1, 2, 3), "test",
                     members=((hosts[1].pk, (0, 1, 2, 3)),))
        ],
        actor=SCHEDULER,
    )  # fmt: skip
    assert start.job.id == job.pk and start.job.attempt == 1

    job_report_apply(node=hosts[1], job_id=job.pk, attempt=1, state="running", pid=9,
                     resumed=True)  # fmt: skip
    assert owner_api.get(f"/api/v1/jobs/{job.pk}/").json()["state"] == "assigned"
    job_report_apply(node=hosts[0], job_id=job.pk, attempt=1, state="running", pid=8,
                     resumed=False)  # fmt: skip
    job_report_apply(
        node=hosts[0], job_id=job.pk, attempt=1, state="running", pid=8, resumed=True
    )  # fmt: skip  (a duplicate: nothing more)

    notes = JobEvent.objects.filter(job=job, reason__startswith="member").order_by("id")
    assert list(notes.values_list("reason", "actor")) == [
        ("member 1 on node gpu-2: attempt 1 resumed from a checkpoint", "gpu-2"),
        ("member 0 on node gpu-1: attempt 1 started fresh", "gpu-1"),
    ]
    body = owner_api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert (body["state"], body["resumed"]) == ("running", True)


def test_a_stranger_sees_no_job_and_so_no_resumed(
    node_key: tuple[Node, str], owner: Any, team: Any, stranger: Any
) -> None:
    from tests.conftest import _client

    job = assigned(node_key[0], owner, team)
    report(node_key, job, "running", resumed=True)

    response = _client(stranger).get(f"/api/v1/jobs/{job.pk}/")

    assert response.status_code in (403, 404)
    assert "resumed" not in response.json()


def test_a_start_known_only_from_a_heartbeat_still_records_resumed(
    node_key: tuple[Node, str], owner: Any, team: Any, owner_api: Any
) -> None:
    from fleet.services.agents import agent_heartbeat

    node, _ = node_key
    job = assigned(node, owner, team)
    outcome = {"job_id": job.pk, "attempt": 1, "state": "running", "pid": 77, "resumed": True}
    agent_heartbeat(node=node, running=[[job.pk, 1, 77, [0]]], outcomes=[outcome])
    assert start_reason(job) == "attempt 1 resumed from a checkpoint"
    assert owner_api.get(f"/api/v1/jobs/{job.pk}/").json()["resumed"] is True


def test_the_job_list_shows_each_jobs_resumed_in_one_query(
    node_key: tuple[Node, str], owner: Any, team: Any, owner_api: Any
) -> None:
    def list_queries() -> tuple[dict[int, Any], int]:
        with CaptureQueriesContext(connection) as ctx:
            rows = owner_api.get("/api/v1/jobs/").json()["results"]
        return {row["id"]: row["resumed"] for row in rows}, len(ctx.captured_queries)

    resumed = assigned(node_key[0], owner, team)
    report(node_key, resumed, "running", resumed=True)
    list_queries()  # the first request of a client reads what later ones have cached
    _, few = list_queries()

    fresh = assigned(node_key[0], owner, team)
    report(node_key, fresh, "running", resumed=False)
    silent = assigned(node_key[0], owner, team)
    waiting = JobFactory(owner=owner, team=team)
    shown, many = list_queries()

    assert shown == {resumed.pk: True, fresh.pk: False, silent.pk: None, waiting.pk: None}
    assert many == few
