"""The policy advisor on real Postgres and Redis: recorded jobs with their events export as a
trace the simulator command line reads back, a run measures what happened and every
candidate, and applying one changes the scheduler's settings (staff only)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from fleet.celery import app
from fleet.models import JobEvent
from scheduler.advisor import history
from scheduler.cycle.config import settings_get, settings_update
from scheduler.policies import policy_names
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_cache() -> Iterator[None]:
    cache.clear()  # this test run's own Redis database
    yield
    cache.clear()


@pytest.fixture
def eager() -> Iterator[None]:
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False


def _job(base: Any, submit: float, events: list[tuple[float, str, str]], **kw: Any) -> Any:
    """A job submitted at base + submit with its state events (seconds after base)."""
    state = events[-1][2] if events else "pending"
    job = JobFactory(state=state, **kw)
    attempt = 0
    for at, src, dst in events:
        attempt += src == "pending" and dst == "assigned"
        ev = JobEvent.objects.create(
            job=job, from_state=src, to_state=dst, attempt=attempt, actor_kind="scheduler"
        )
        JobEvent.objects.filter(pk=ev.pk).update(at=base + timedelta(seconds=at))
    finished = base + timedelta(seconds=events[-1][0]) if state == "succeeded" else None
    type(job).objects.filter(pk=job.pk).update(
        submitted_at=base + timedelta(seconds=submit), finished_at=finished, attempt=attempt
    )
    return job


def _ran(start: float, end: float) -> list[tuple[float, str, str]]:
    return [
        (start, "pending", "assigned"),
        (start, "assigned", "running"),
        (end, "running", "succeeded"),
    ]


@pytest.fixture
def history_jobs(fleet_nodes: Any, owner: Any, teammate: Any, outsider: Any) -> dict[str, Any]:
    """Three jobs that ran a day ago, one still pending, one cancelled while waiting, one
    from last month. 6 GPUs (4 A100 + 2 V100)."""
    base = timezone.now() - timedelta(days=1)
    vision, speech = owner.memberships.get().team, outsider.memberships.get().team
    j1 = _job(base, 0, _ran(0, 100), owner=owner, team=vision, name="train")
    j2 = _job(base, 10, _ran(100, 150), owner=teammate, team=vision, gpus=2, name="train")
    j3 = _job(
        base, 0,
        [(0, "pending", "assigned"), (0, "assigned", "running"), (20, "running", "pending"),
         (40, "pending", "assigned"), (40, "assigned", "running"), (70, "running", "succeeded")],
        owner=outsider, team=speech, gpus=2, preemptible=True, name="asr",
    )  # fmt: skip
    waiting = _job(base, 50, [], owner=owner, team=vision)
    gone = _job(base, 60, [(65, "pending", "cancelled")], owner=owner, team=vision)
    old = _job(base - timedelta(days=30), 0, _ran(0, 10), owner=owner, team=vision)
    return {"ran": [j1, j2, j3], "waiting": waiting, "gone": gone, "old": old}


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_trace_csv_is_read_back_by_the_simulator_cli(staff_api, history_jobs, tmp_path):
    response = staff_api.get("/api/v1/advisor/trace.csv?days=7")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    text = response.content.decode()
    rows = _rows(text)
    assert sorted(int(r["id"]) for r in rows) == sorted(j.pk for j in history_jobs["ran"])
    by_id = {int(r["id"]): r for r in rows}
    j3 = by_id[history_jobs["ran"][2].pk]
    # Its last attempt ran 30 s; the first, preempted after 20 s, is not counted.
    assert (float(j3["runtime"]), j3["gpus"], j3["preemptible"], j3["team"]) == (
        30.0, "2", "true", "speech",
    )  # fmt: skip
    cluster = response["X-Fleet-Cluster"]
    assert cluster == "1x4xA100-80GB+1x2xV100-32GB"
    trace = tmp_path / "fleet.csv"
    trace.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.sim", "--trace", str(trace), "--format", "fleet",
         "--cluster", cluster, "--cpus-per-gpu", "0", "--memory-gb-per-gpu", "0",
         "--policy", "fcfs", "--json", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["prep"]["loaded"] == 3
    fcfs = out["policies"]["fcfs"]
    assert fcfs["finished"] == 3
    # 5 GPUs asked at once fit 6: nobody waits in the replay.
    assert fcfs["queue_avg"] == pytest.approx(0.0)


def test_export_trace_command_writes_the_same_trace(history_jobs, tmp_path, capsys):
    out = tmp_path / "out.csv"
    call_command("export_trace", str(out), "--days", "7")
    rows = _rows(out.read_text())
    assert len(rows) == 3
    err = capsys.readouterr().err
    assert "1 pending job left out: never started" in err
    assert "1 cancelled job left out: never started" in err
    assert "--format fleet --cluster '1x4xA100-80GB+1x2xV100-32GB'" in err


def test_run_measures_what_happened_and_every_policy(staff_api, history_jobs, eager):
    response = staff_api.post("/api/v1/advisor/runs/", {"days": 7})
    assert response.status_code == 202, response.json()
    run_id = response.json()["id"]
    run = staff_api.get(f"/api/v1/advisor/runs/{run_id}/").json()
    assert run["state"] == "done", run["error"]
    assert run["done"] == run["total"] == len(run["candidates"]) > len(policy_names())
    assert run["jobs_in_window"] == 5
    actual = run["actual"]["metrics"]
    # Waits 0, 90, 0; JCTs 100, 140, 70; GPU-seconds 100 + 2 x 50 + 2 x (20 + 30) = 300 on
    # 6 GPUs over 150 s; one preemption in three jobs.
    assert actual["jobs"] == 3
    assert actual["wait_avg"] == pytest.approx(30.0, abs=1e-3)
    assert actual["jct_avg"] == pytest.approx(310 / 3, abs=1e-3)
    assert actual["utilization"] == pytest.approx(300 / 900, abs=1e-4)
    assert actual["preemptions_per_job"] == pytest.approx(1 / 3)
    vision = (1 + 140 / 50) / 2
    assert actual["team_slowdown"] == pytest.approx({"vision": vision, "speech": 70 / 30})
    assert {c["policy"] for c in run["candidates"]} == set(policy_names())
    fcfs = next(c for c in run["candidates"] if c["policy"] == "fcfs" and not c["params"])
    assert fcfs["metrics"]["wait_avg"] == pytest.approx(0.0)
    assert fcfs["metrics"]["jobs"] == 3
    # Nobody waits in the replays without preemption; 30 s on average happened.
    assert str(fcfs["index"]) in run["best"]["wait_avg"]
    assert "actual" not in run["best"]["wait_avg"]
    assert cache.get("advisor:active") is None  # the guard is released


def test_apply_changes_the_active_policy_once(staff_api, history_jobs, eager):
    settings_update(user=None, policy="priority", params={"priority_weight_age": 5.0})
    run = staff_api.post("/api/v1/advisor/runs/", {"days": 7}).json()
    run = staff_api.get(f"/api/v1/advisor/runs/{run['id']}/").json()
    k = next(
        c["index"] for c in run["candidates"] if c["params"] == {"priority_weight_fairshare": 1e4}
    )
    response = staff_api.post(f"/api/v1/advisor/runs/{run['id']}/apply/", {"candidate": k})
    assert response.status_code == 200, response.json()
    row = settings_get()
    assert row.policy == "priority"
    # The run compared against the weights set then; the candidate's override is added.
    assert row.params == {"priority_weight_age": 5.0, "priority_weight_fairshare": 1e4}
    assert row.updated_by == "staff"
    fcfs = next(c["index"] for c in run["candidates"] if c["policy"] == "fcfs")
    again = staff_api.post(f"/api/v1/advisor/runs/{run['id']}/apply/", {"candidate": fcfs})
    assert again.status_code == 409
    assert "changed the scheduler settings" in again.json()["message"]
    assert settings_get().policy == "priority"


def test_apply_is_refused_after_someone_else_changed_the_settings(
    staff_api, history_jobs, eager, team_admin
):
    run = staff_api.post("/api/v1/advisor/runs/", {"days": 7}).json()
    settings_update(user=team_admin, policy="sjf")
    response = staff_api.post(f"/api/v1/advisor/runs/{run['id']}/apply/", {"candidate": 0})
    assert response.status_code == 409
    assert response.json()["message"].startswith("teamadmin changed the scheduler settings")
    assert settings_get().policy == "sjf"


def test_bad_requests_get_a_sentence(staff_api, history_jobs, eager, monkeypatch):
    for body in ({"days": 0}, {"days": 91}, {"days": "a week"}, {"weeks": 1}):
        response = staff_api.post("/api/v1/advisor/runs/", body, format="json")
        assert response.status_code == 400, body
        assert response.json()["message"]
    run = staff_api.post("/api/v1/advisor/runs/", {"days": 7}).json()
    for k in (99, -1, "x"):
        response = staff_api.post(f"/api/v1/advisor/runs/{run['id']}/apply/", {"candidate": k})
        assert response.status_code == 400, k
    missing = staff_api.get("/api/v1/advisor/runs/0123456789abcdef/")
    assert missing.status_code == 404
    assert "kept for a day" in missing.json()["message"]
    monkeypatch.setattr(history, "MAX_JOBS", 4)
    response = staff_api.post("/api/v1/advisor/runs/", {"days": 7})
    assert response.status_code == 400
    assert response.json()["message"] == (
        "The last 7 days hold 5 jobs; the advisor replays at most 4. Ask for fewer days."
    )


def test_one_run_at_a_time(staff_api, history_jobs):
    from scheduler.tasks import advisor_run

    first = staff_api.post("/api/v1/advisor/runs/", {"days": 7})
    assert first.status_code == 202
    assert first.json()["state"] == "queued"
    second = staff_api.post("/api/v1/advisor/runs/", {"days": 3})
    assert second.status_code == 409
    assert "already in progress" in second.json()["message"]
    # The worker takes the queued run (here in-process), which frees the advisor.
    advisor_run.apply(kwargs={"run_id": first.json()["id"]})
    assert staff_api.post("/api/v1/advisor/runs/", {"days": 3}).status_code == 202


def test_a_fleet_without_gpus_is_refused(staff_api, owner):
    response = staff_api.post("/api/v1/advisor/runs/", {"days": 7})
    assert response.status_code == 400
    assert "no node that is up or draining with GPUs" in response.json()["message"]


def test_only_staff(teammate_api, anon_api, teammate, history_jobs):
    urls = [
        ("get", "/api/v1/advisor/trace.csv"),
        ("post", "/api/v1/advisor/runs/"),
        ("get", "/api/v1/advisor/runs/0123456789abcdef/"),
        ("post", "/api/v1/advisor/runs/0123456789abcdef/apply/"),
    ]
    for method, url in urls:
        body = {"data": {"days": 1}} if method == "post" else {}
        assert getattr(teammate_api, method)(url, **body).status_code == 403, url
        assert getattr(anon_api, method)(url).status_code == 401, url
    browser = Client()
    browser.force_login(teammate)
    assert browser.get("/advisor/").status_code == 403
    assert Client().get("/advisor/").status_code == 302  # to the login page


def test_page_runs_shows_and_applies(staff, history_jobs, eager):
    browser = Client()
    browser.force_login(staff)
    page = browser.get("/scheduler/")
    assert b'href="/advisor/"' in page.content
    response = browser.post("/advisor/", {"days": "7"})
    assert response.status_code == 302
    page = browser.get(response["Location"])
    html = page.content.decode()
    assert page.status_code == 200
    assert "What happened" in html and "<mark" in html
    assert html.index("What happened") < html.index("fcfs (current weights)")
    assert "js/advisor.js" in html
    run_id = response["Location"].split("run=")[1]
    done = browser.post(f"/advisor/runs/{run_id}/apply/", {"candidate": "0"})
    assert done.status_code == 302 and done["Location"] == "/scheduler/"
    assert settings_get().policy == policy_names()[0]
    bad = browser.post("/advisor/", {"days": "0"})
    assert bad.status_code == 400
    assert "days must be a whole number from 1 to 90." in bad.content.decode()


def test_page_shows_progress_while_the_run_waits(staff, history_jobs):
    from scheduler.tasks import advisor_run

    browser = Client()
    browser.force_login(staff)
    location = browser.post("/advisor/", {"days": "7"})["Location"]
    run_id = location.split("run=")[1]
    html = browser.get("/advisor/").content.decode()  # the latest run, without ?run=
    assert f'data-advisor-run="/api/v1/advisor/runs/{run_id}/"' in html
    assert '<progress id="advisor-progress"' in html
    assert "waiting for the control worker" in html
    busy = browser.post("/advisor/", {"days": "7"})
    assert busy.status_code == 409
    assert "already in progress" in busy.content.decode()
    advisor_run.apply(kwargs={"run_id": run_id})
    assert "<progress" not in browser.get(location).content.decode()


def test_a_run_no_worker_took_is_replaced_after_the_grace(staff_api, history_jobs):
    from scheduler.advisor import runs

    first = staff_api.post("/api/v1/advisor/runs/", {"days": 7}).json()
    assert staff_api.post("/api/v1/advisor/runs/", {"days": 7}).status_code == 409
    # No control worker takes it: ten minutes later, a new start replaces it.
    queued = json.loads(cache.get(runs._key(first["id"])))
    started = timezone.now() - timedelta(seconds=runs.QUEUE_GRACE_S + 1)
    queued["created_at"] = started.isoformat()
    cache.set(runs._key(first["id"]), json.dumps(queued))
    second = staff_api.post("/api/v1/advisor/runs/", {"days": 7})
    assert second.status_code == 202, second.json()
    old = staff_api.get(f"/api/v1/advisor/runs/{first['id']}/").json()
    assert old["state"] == "failed" and "No control worker took this run" in old["error"]
    # The lost message arriving late changes nothing: the run is no longer queued.
    from scheduler.tasks import advisor_run

    assert advisor_run.apply(kwargs={"run_id": first["id"]}).get() is None
    assert cache.get(runs.ACTIVE_KEY) == second.json()["id"]
