"""What a cycle writes for waiting jobs: their order and reasons once, in one row, when they
changed (scheduler.cycle.queue_order), and nothing on their rows: a job that goes first moves
every other job back a place and changes every other job's reason (the job GPUs are
reserved for) without a write to their rows."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Job, JobState
from fleet.selectors.jobs import job_state_reason
from scheduler.cycle.config import settings_get
from scheduler.cycle.queue_order import queue_waits
from scheduler.cycle.runner import run_cycle
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = pytest.mark.django_db


def _rows() -> dict[int, tuple[str, Any, Any]]:
    rows = Job.objects.filter(state=JobState.PENDING).values_list(
        "id", "state_reason", "queue_position", "eta"
    )
    return {job_id: (reason, position, eta) for job_id, reason, position, eta in rows}


def _use_priority(*, reservation: bool) -> None:
    row = settings_get()
    row.policy = "priority"
    row.params = {**(row.params or {}), "eta_interval": 3600, "priority_reservation": reservation}
    row.save()


def test_a_second_cycle_with_nothing_changed_writes_nothing(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    _use_priority(reservation=False)
    make_running(owner, team, make_node("sim-a", 1), [0], time_limit=3600)
    waiting = [make_job(owner, team, time_limit=3600) for _ in range(150)]
    first = run_cycle()
    assert first is not None and first.placed == 0
    assert first.timings["order_written"] == 1 and first.timings["waits_written"] == 0
    waits = queue_waits()
    assert sorted(waits.positions.values()) == list(range(1, 151))
    assert set(waits.ids) == {j.pk for j in waiting}
    stored = _rows()

    with CaptureQueriesContext(connection) as queries:
        second = run_cycle()
    assert second is not None and second.timings["order_written"] == 0
    assert _rows() == stored and queue_waits() == waits
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert not any("fleet_job" in sql or "queueorder" in sql for sql in updates), updates
    assert len(queries.captured_queries) <= 30, len(queries.captured_queries)


def test_a_job_that_goes_first_moves_every_position_and_reason_in_one_write(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    # With a reservation, every waiting job's reason names the job GPUs are reserved for.
    _use_priority(reservation=True)
    make_running(owner, team, make_node("sim-a", 1), [0], time_limit=3600)
    waiting = [make_job(owner, team, time_limit=3600) for _ in range(150)]
    run_cycle()
    before = queue_waits()
    reasons = {j.pk: job_state_reason(job=j, fetched_by=owner) for j in waiting}
    assert f"reserved for job {waiting[0].pk}" in reasons[waiting[1].pk]
    stored = _rows()

    urgent = make_job(owner, team, time_limit=3600, priority=20)
    with CaptureQueriesContext(connection) as queries:
        third = run_cycle()
    assert third is not None and third.timings["order_written"] == 1
    job_updates = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "fleet_job"')
    ]
    assert job_updates == [] and third.timings["waits_written"] == 0
    assert {pk: row for pk, row in _rows().items() if pk != urgent.pk} == stored
    after = queue_waits()
    assert after.position(urgent.pk) == 1
    assert all(after.position(j.pk) == before.position(j.pk) + 1 for j in waiting)  # type: ignore[operator]
    for job in waiting:
        shown = job_state_reason(job=job, fetched_by=owner)
        assert f"reserved for job {urgent.pk}" in shown and shown != reasons[job.pk]


def test_a_position_left_on_a_row_and_a_past_eta_are_cleared_once(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    _use_priority(reservation=False)
    make_running(owner, team, make_node("sim-a", 1), [0], time_limit=3600)
    jobs = [make_job(owner, team, time_limit=3600) for _ in range(3)]
    run_cycle()
    soon = timezone.now() + timedelta(hours=1)
    Job.objects.filter(pk=jobs[1].pk).update(queue_position=7)
    Job.objects.filter(pk=jobs[2].pk).update(eta=timezone.now() - timedelta(minutes=1))
    Job.objects.filter(pk=jobs[0].pk).update(eta=soon)
    cleared = run_cycle()
    assert cleared is not None and cleared.timings["waits_written"] == 2
    rows = _rows()
    assert all(position is None for _, position, _ in rows.values())
    assert rows[jobs[2].pk][2] is None and rows[jobs[0].pk][2] == soon
    assert queue_waits().positions == {j.pk: n for n, j in enumerate(jobs, start=1)}
