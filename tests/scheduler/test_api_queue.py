from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from fleet.models import Job, JobEvent
from scheduler.cycle.config import settings_update
from scheduler.cycle.runner import run_cycle
from scheduler.models import CycleRecord, TeamUsage
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = pytest.mark.django_db


QUEUE = "/api/v1/queue/"
ESTIMATE = "/api/v1/jobs/estimate/"


@pytest.fixture
def full_fleet(owner: Any, team: Any) -> Any:
    """sim-a with 4 GPUs, all busy for an hour."""
    node = make_node("sim-a", 4)
    make_running(owner, team, node, [0, 1, 2, 3])
    return node


def test_queue_lists_waiting_jobs_in_the_policys_order(
    owner_api: Any, owner: Any, team: Any, teammate: Any, outsider: Any, other_team: Any,
    full_fleet: Any, sent: list[Any],
) -> None:  # fmt: skip
    low = make_job(owner, team, priority=-50)
    high = make_job(teammate, team, priority=90)
    middle = make_job(outsider, other_team, priority=10)
    # Only the job's own priority counts: the order is plain to check by hand.
    settings_update(
        user=None,
        policy="priority",
        params={"priority_weight_fairshare": 0, "priority_weight_age": 0},
    )
    run_cycle()
    body = owner_api.get(QUEUE).json()
    assert body["policy"] == "priority" and body["cycle_at"] is not None
    assert [j["id"] for j in body["pending"]] == [high.pk, middle.pk, low.pk]
    assert [j["queue_position"] for j in body["pending"]] == [1, 2, 3]
    first = body["pending"][0]
    assert first["pending_reason"].startswith("first in line: GPUs 0 on sim-a are reserved for it")
    assert first["eta"] is not None
    assert [(j["state"], j["node"]) for j in body["running"]] == [("running", "sim-a")]
    assert body["pending_count"] == 3

    mine = owner_api.get(QUEUE, {"mine": "1"}).json()
    assert [j["id"] for j in mine["pending"]] == [low.pk] and len(mine["running"]) == 1
    speech = owner_api.get(QUEUE, {"team": "speech"}).json()
    assert [j["id"] for j in speech["pending"]] == [middle.pk] and speech["running"] == []

    # Job detail shows what the cycle wrote.
    detail = owner_api.get(f"/api/v1/jobs/{low.pk}/").json()
    assert detail["queue_position"] == 3 and detail["eta"] is not None
    assert detail["pending_reason"] and "needs 1 GPU on one node" in detail["pending_reason"]

    # Under fcfs the next cycle puts them in submit order.
    settings_update(user=None, policy="fcfs")
    run_cycle()
    body = owner_api.get(QUEUE).json()
    assert body["policy"] == "fcfs"
    assert [j["id"] for j in body["pending"]] == [low.pk, high.pk, middle.pk]


def test_queue_refuses_a_stranger(stranger_api: Any) -> None:
    assert stranger_api.get(QUEUE).status_code == 403
    assert (
        stranger_api.post(ESTIMATE, {"name": "x", "command": "x"}, format="json").status_code == 403
    )


def _counts() -> tuple[int, int, int, int]:
    return (
        Job.objects.count(),
        JobEvent.objects.count(),
        TeamUsage.objects.count(),
        CycleRecord.objects.count(),
    )


def test_estimate_says_where_a_job_would_start_and_writes_nothing(
    owner_api: Any, owner: Any, team: Any, sent: list[Any]
) -> None:
    make_node("sim-a", 4)
    make_node("sim-b", 2, model="V100-32GB")
    before = _counts()
    response = owner_api.post(
        ESTIMATE, {"name": "train", "command": "python t.py", "gpus": 2, "gpu_model": "v100-32gb"},
        format="json",
    )  # fmt: skip
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body == {
        "would_start_now": True,
        "node": "sim-b",
        "estimated_start": body["estimated_start"],
        "reason": "would start now on sim-b",
        "policy": "gittins-tiers",
        "team": "vision",
    }
    assert _counts() == before and sent == []


def test_estimate_for_a_full_fleet_gives_a_start_time_and_reason(
    owner_api: Any, owner: Any, team: Any, full_fleet: Any, sent: list[Any]
) -> None:
    settings_update(user=None, policy="fcfs")
    make_job(owner, team, time_limit=3600)
    run_cycle()
    before = _counts()
    body = owner_api.post(
        ESTIMATE, {"name": "t", "command": "x", "gpus": 4, "time_limit": 600}, format="json"
    ).json()
    assert body["would_start_now"] is False and body["node"] is None
    assert body["reason"] == (
        "would be number 2 in the queue: queued behind job "
        f"{Job.objects.get(state='pending').pk}, which does not fit yet"
    )
    # The fleet frees up in an hour; the job ahead then runs for its hour on one GPU.
    start = datetime.fromisoformat(body["estimated_start"])
    running = Job.objects.get(state="running")
    assert running.started_at is not None
    assert start - running.started_at == pytest.approx(timedelta(hours=2), abs=timedelta(seconds=2))
    assert _counts() == before


@pytest.mark.parametrize(
    ("overrides", "field", "needle"),
    [
        ({"gpus": 8}, "gpus", "needs 8 GPUs on one node; the largest node has 4"),
        ({"gpu_model": "H100"}, "gpu_model", "No node has GPU model 'H100'"),
        ({"time_limit": 90000}, "time_limit", "over team vision's maximum of 86400 s"),
    ],
)
def test_estimate_validates_like_submit(
    owner_api: Any, fleet_nodes: Any, overrides: dict[str, Any], field: str, needle: str
) -> None:
    body = {"name": "train", "command": "python train.py", "gpus": 1, **overrides}
    estimate = owner_api.post(ESTIMATE, body, format="json")
    submit = owner_api.post("/api/v1/jobs/", body, format="json")
    assert estimate.status_code == submit.status_code == 400
    assert estimate.json() == submit.json()
    assert field in estimate.json()["extra"]["fields"] and needle in estimate.json()["message"]
