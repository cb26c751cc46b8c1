"""Exact GPU-time accounting: every attempt counts, from the job event history written by the
real state machine at controlled times; /api/v1/usage/ shows it per team, user or attempt."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine

from fleet.models import Job
from fleet.selectors.usage import gpu_hours
from fleet.services.job_states import SCHEDULER, SYSTEM, Actor, job_record_ignored, job_transition
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
M = timedelta(minutes=1)
H = timedelta(hours=1)
NOW = T0 + 6 * H


def _at(moment: datetime, job: Any, action: str, **kw: Any) -> Job:
    with time_machine.travel(moment, tick=False):
        return job_transition(job_id=job.pk, action=action, actor=kw.pop("actor", SCHEDULER), **kw)


def _run(job: Any, node: Any, dispatch_at: datetime, start_at: datetime) -> None:
    _at(dispatch_at, job, "dispatch", fields={"node": node, "gpu_indices": [0]})
    _at(start_at, job, "start", actor=Actor.node(node.name))


@pytest.fixture
def history(owner: Any, teammate: Any, outsider: Any, team: Any, other_team: Any,
            fleet_nodes: Any) -> dict[str, Any]:  # fmt: skip
    """Three jobs with requeues, a preemption, a loss and a stale report. Returns the jobs
    and each attempt's (team, user, gpus, start, end) as the test computes it."""
    node = fleet_nodes[0]
    a: Any = JobFactory(owner=owner, team=team, gpus=2, preemptible=True)
    b: Any = JobFactory(owner=teammate, team=team, gpus=1)
    c: Any = JobFactory(owner=outsider, team=other_team, gpus=0, gpu_memory_mb=1000,
                   gpu_compute_percent=50)  # fmt: skip
    # a: preempted after 59 min, runs again 1 h and succeeds.
    _run(a, node, T0, T0 + M)
    _at(T0 + H, a, "preempt", reason="preempted by a higher-priority job")
    _run(a, node, T0 + 2 * H, T0 + 2 * H + 5 * M)
    _at(T0 + 3 * H + 5 * M, a, "succeed", actor=Actor.node(node.name))
    # b: requeued after 30 min, lost after 1 h on its second attempt, recovered and running.
    _run(b, node, T0, T0)
    _at(T0 + 30 * M, b, "requeue", actor=SYSTEM)
    _run(b, node, T0 + H, T0 + H)
    _at(T0 + 2 * H, b, "lose", actor=SYSTEM)
    # A late report for attempt 1 is recorded, not applied: it must not count.
    with time_machine.travel(T0 + 2 * H + M, tick=False):
        job_record_ignored(job_id=b.pk, action="succeed", actor=Actor.node(node.name),
                           attempt=1, why="stale attempt")  # fmt: skip
    _at(T0 + 2 * H + 2 * M, b, "recover", actor=SYSTEM)
    _run(b, node, T0 + 4 * H, T0 + 4 * H + 10 * M)
    # c: half a GPU for 1 h, then fails.
    _run(c, node, T0 + H, T0 + H)
    _at(T0 + 2 * H, c, "fail", actor=Actor.node(node.name))
    attempts = [
        ("vision", "owner", 2.0, T0 + M, T0 + H),
        ("vision", "owner", 2.0, T0 + 2 * H + 5 * M, T0 + 3 * H + 5 * M),
        ("vision", "teammate", 1.0, T0, T0 + 30 * M),
        ("vision", "teammate", 1.0, T0 + H, T0 + 2 * H),
        ("vision", "teammate", 1.0, T0 + 4 * H + 10 * M, NOW),  # still running
        ("speech", "outsider", 0.5, T0 + H, T0 + 2 * H),
    ]
    return {"a": a, "b": b, "c": c, "attempts": attempts}


def _expected(attempts: list[Any], since: datetime, until: datetime) -> dict[Any, float]:
    by_user: dict[Any, float] = {}
    for team, user, gpus, start, end in attempts:
        seconds = (min(end, until, NOW) - max(start, since)).total_seconds()
        if seconds > 0:
            by_user[(team, user)] = by_user.get((team, user), 0.0) + seconds * gpus / 3600
    return by_user


def test_every_attempt_counts(history: dict[str, Any]) -> None:
    usage = gpu_hours(since=T0 - H, until=T0 + 24 * H, now=NOW)
    expected = _expected(history["attempts"], T0 - H, T0 + 24 * H)
    assert usage.by_user == pytest.approx(expected)
    # owner: 2 GPUs x (59 + 60) min; teammate: 30 + 60 + 110 min; outsider: 30 min.
    assert usage.by_team == pytest.approx({"vision": 2 * 119 / 60 + 200 / 60, "speech": 0.5})
    assert len(usage.attempts) == 6
    # The job's columns hold only its last attempt: the old count would miss the rest.
    a = Job.objects.get(pk=history["a"].pk)
    assert a.finished_at and a.started_at
    last_only = 2 * (a.finished_at - a.started_at).total_seconds() / 3600
    assert usage.by_user[("vision", "owner")] > last_only + 1.9


def test_attempts_are_clipped_to_the_period(history: dict[str, Any]) -> None:
    since, until = T0 + 45 * M, T0 + 4 * H + 40 * M
    usage = gpu_hours(since=since, until=until, now=NOW)
    assert usage.by_user == pytest.approx(_expected(history["attempts"], since, until))
    running = [a for a in usage.attempts if a.state == "running"]
    assert [(r.start, r.end) for r in running] == [(T0 + 4 * H + 10 * M, until)]
    # A period before anything ran counts nothing.
    assert gpu_hours(since=T0 - 3 * H, until=T0, now=NOW).attempts == []


def test_usage_api_by_team_and_user(
    history: dict[str, Any], staff_api: Any, owner_api: Any
) -> None:
    params = {"since": (T0 - H).isoformat(), "until": (T0 + 24 * H).isoformat()}
    with time_machine.travel(NOW, tick=False):
        staff = staff_api.get("/api/v1/usage/", params).json()
        mine = owner_api.get("/api/v1/usage/", {**params, "by": "user"}).json()
    expected = _expected(history["attempts"], T0 - H, T0 + 24 * H)
    by_team = {r["team"]: r["gpu_hours"] for r in staff["rows"]}
    assert by_team == pytest.approx({"vision": 2 * 119 / 60 + 200 / 60, "speech": 0.5}, abs=1e-5)
    assert staff["gpu_hours"] == pytest.approx(sum(expected.values()), abs=1e-5)
    assert {r["team"]: r["attempts"] for r in staff["rows"]} == {"vision": 5, "speech": 1}
    # A member sees only their own team's usage.
    assert {(r["team"], r["user"]) for r in mine["rows"]} == {
        ("vision", "owner"),
        ("vision", "teammate"),
    }
    assert sum(r["gpu_hours"] for r in mine["rows"]) == pytest.approx(mine["gpu_hours"], abs=1e-5)


def test_usage_api_csv_per_attempt(history: dict[str, Any], owner_api: Any) -> None:
    params = {"since": "2026-03-01T00:00:00Z", "until": "2026-03-02T00:00:00Z", "by": "attempt",
              "format": "csv"}  # fmt: skip
    with time_machine.travel(NOW, tick=False):
        response = owner_api.get("/api/v1/usage/", params)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["JobID"], r["Attempt"], r["State"]) for r in rows] == [
        (str(history["b"].pk), "1", "pending"),
        (str(history["a"].pk), "1", "pending"),
        (str(history["b"].pk), "2", "lost"),
        (str(history["a"].pk), "2", "succeeded"),
        (str(history["b"].pk), "3", "running"),
    ]
    assert rows[1]["Elapsed"] == "00:59:00" and rows[1]["AllocGPUs"] == "2.0"
    assert sum(float(r["GPUSeconds"]) for r in rows) == pytest.approx(
        3600 * sum(_expected(history["attempts"][:5], T0 - H, T0 + 24 * H).values())
    )


def test_usage_api_refuses_bad_input_and_other_teams(
    history: dict[str, Any], owner_api: Any, outsider_api: Any, stranger_api: Any, anon_api: Any
) -> None:
    bad = owner_api.get("/api/v1/usage/", {"since": "yesterday"})
    assert bad.status_code == 400 and bad.json()["message"].startswith("since:")
    backwards = owner_api.get("/api/v1/usage/", {"since": "2026-03-02T00:00Z",
                                                 "until": "2026-03-01T00:00Z"})  # fmt: skip
    assert backwards.status_code == 400 and "before until" in backwards.json()["message"]
    assert owner_api.get("/api/v1/usage/", {"by": "node"}).status_code == 400
    xml = owner_api.get("/api/v1/usage/", {"format": "xml"})
    assert xml.status_code == 400 and "format=json or format=csv" in xml.json()["message"]
    assert owner_api.get("/api/v1/usage/", {"sinse": "x"}).status_code == 400
    other = outsider_api.get("/api/v1/usage/", {"team": "vision"})
    assert other.status_code == 400 and "vision" in other.json()["message"]
    assert stranger_api.get("/api/v1/usage/").status_code == 403
    assert anon_api.get("/api/v1/usage/").status_code == 401


def test_the_usage_page_shows_the_same_numbers(history: dict[str, Any], staff_api: Any) -> None:
    from fleet.web.views.usage import usage_data

    since, until = T0 - H, T0 + 24 * H
    page = usage_data("24h", since, until, NOW)
    params = {"since": since.isoformat(), "until": until.isoformat()}
    with time_machine.travel(NOW, tick=False):
        api = staff_api.get("/api/v1/usage/", params).json()
    assert page["total"] == pytest.approx(api["gpu_hours"], abs=1e-3)
    assert {t["slug"]: t["gpu_hours"] for t in page["teams"]} == pytest.approx(
        {r["team"]: r["gpu_hours"] for r in api["rows"]}, abs=1e-3
    )


def test_host_cpu_and_memory_hours_of_a_requeued_gang(
    owner: Any, team: Any, fleet_nodes: Any, staff_api: Any
) -> None:
    """A two-node gang holds its CPUs and memory on each node; a requeue ends one attempt
    and the next counts again. Totals equal the sum over attempts, per node."""
    from fleet.services.job_batches import Dispatch, job_dispatch_starts
    from fleet.services.job_reports import job_report_apply

    a, b = fleet_nodes
    gang: Any = JobFactory(owner=owner, team=team, gpus=4, gpus_per_node=2, cpus=6,
                           memory_mb=3072)  # fmt: skip
    single: Any = JobFactory(owner=owner, team=team, gpus=1, cpus=2, memory_mb=1024)

    def dispatch_and_run(at: datetime) -> None:
        with time_machine.travel(at, tick=False):
            job = Job.objects.get(pk=gang.pk)
            members = ((b.pk, (0, 1)),)
            job_dispatch_starts(
                dispatches=[Dispatch(job.pk, job.attempt, a.pk, (0, 1), "test", members=members)],
                actor=SCHEDULER,
            )
            attempt = job.attempt + 1
            for node in (a, b):
                job_report_apply(node=node, job_id=job.pk, attempt=attempt, state="running", pid=9)
        assert Job.objects.get(pk=gang.pk).state == "running"

    dispatch_and_run(T0)
    _at(T0 + 30 * M, gang, "requeue", actor=SYSTEM)
    dispatch_and_run(T0 + H)
    _at(T0 + 3 * H, gang, "succeed", actor=Actor.node(a.name))
    _run(single, a, T0, T0 + H)
    _at(T0 + 2 * H, single, "fail", actor=Actor.node(a.name))

    usage = gpu_hours(since=T0 - H, until=T0 + 24 * H, now=NOW)
    by_job = {(u.job_id, u.attempt): u for u in usage.attempts}
    assert {(k, u.cpus, u.memory_mb) for k, u in by_job.items()} == {
        ((gang.pk, 1), 12, 6144),
        ((gang.pk, 2), 12, 6144),
        ((single.pk, 1), 2, 1024),
    }
    # gang: 2 nodes x 6 CPUs x (0.5 + 2) h; single: 2 CPUs x 1 h.
    cpu_hours = 2 * 6 * 2.5 + 2 * 1
    mem_gb_hours = 2 * 3 * 2.5 + 1 * 1
    params = {"since": (T0 - H).isoformat(), "until": (T0 + 24 * H).isoformat()}
    with time_machine.travel(NOW, tick=False):
        body = staff_api.get("/api/v1/usage/", params).json()
        per_attempt = staff_api.get("/api/v1/usage/", {**params, "by": "attempt"}).json()
        text = staff_api.get("/api/v1/usage/", {**params, "by": "attempt", "format": "csv"})
        by_user = staff_api.get("/api/v1/usage/", {**params, "by": "user", "format": "csv"})
    assert body["cpu_hours"] == pytest.approx(cpu_hours, abs=1e-5)
    assert body["mem_gb_hours"] == pytest.approx(mem_gb_hours, abs=1e-5)
    assert body["gpu_hours"] == pytest.approx(4 * 2.5 + 1, abs=1e-5)
    assert sum(r["cpu_hours"] for r in per_attempt["rows"]) == pytest.approx(cpu_hours, abs=1e-5)
    assert [r["cpu_hours"] for r in body["rows"]] == pytest.approx([cpu_hours], abs=1e-5)
    rows = list(csv.DictReader(io.StringIO(text.content.decode())))
    assert sorted((r["AllocCPUS"], r["AllocMemMB"], r["CPUHours"]) for r in rows) == [
        ("12", "6144", "24.0"), ("12", "6144", "6.0"), ("2", "1024", "2.0"),
    ]  # fmt: skip
    assert sum(float(r["MemGBHours"]) for r in rows) == pytest.approx(mem_gb_hours)
    (user_row,) = csv.DictReader(io.StringIO(by_user.content.decode()))
    assert float(user_row["CPUHours"]) == pytest.approx(cpu_hours)
    assert float(user_row["MemGBHours"]) == pytest.approx(mem_gb_hours)
    from fleet.web.views.usage import usage_data

    page = usage_data("24h", T0 - H, T0 + 24 * H, NOW)
    assert page["cpu_total"] == pytest.approx(cpu_hours, abs=1e-3)
    assert page["mem_gb_total"] == pytest.approx(mem_gb_hours, abs=1e-3)
    assert {t["slug"]: t["cpu_hours"] for t in page["teams"]}[team.slug] == pytest.approx(cpu_hours)
    assert [(u["user"], u["mem_gb_hours"]) for u in page["users"]] == [("owner", mem_gb_hours)]
