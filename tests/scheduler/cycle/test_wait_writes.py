"""What a cycle writes for waiting jobs: reasons and ETAs on their rows when they change,
and their order once, in one row, when it changed (scheduler.cycle.positions): a job that
goes first moves every other job back a place without a write to their rows."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Job, JobState
from scheduler.cycle.config import settings_get
from scheduler.cycle.positions import queue_positions
from scheduler.cycle.runner import run_cycle
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = pytest.mark.django_db


def _waits() -> dict[int, tuple[str, Any, Any]]:
    rows = Job.objects.filter(state=JobState.PENDING).values_list(
        "id", "state_reason", "queue_position", "eta"
    )
    return {job_id: (reason, position, eta) for job_id, reason, position, eta in rows}


def _use_priority_without_reservation() -> None:
    row = settings_get()
    row.policy = "priority"
    # No reservation: reasons do not name the first in line, so they stay as they are.
    row.params = {**(row.params or {}), "eta_interval": 3600, "priority_reservation": False}
    row.save()


def test_a_second_cycle_with_nothing_changed_writes_no_waiting_row(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    _use_priority_without_reservation()
    make_running(owner, team, make_node("sim-a", 1), [0], time_limit=3600)
    waiting = [make_job(owner, team, time_limit=3600) for _ in range(150)]
    first = run_cycle()
    assert first is not None and first.placed == 0
    assert first.timings["waits_written"] == 150 and first.timings["order_written"] == 1
    stored = _waits()
    assert all(position is None for _, position, _ in stored.values())
    positions = dict(queue_positions())
    assert sorted(positions.values()) == list(range(1, 151))
    assert set(positions) == {j.pk for j in waiting}

    with CaptureQueriesContext(connection) as queries:
        second = run_cycle()
    assert second is not None and second.timings["waits_written"] == 0
    assert second.timings["order_written"] == 0
    assert _waits() == stored and queue_positions() == positions
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert not any("fleet_job" in sql or "queueorder" in sql for sql in updates), updates
    assert len(queries.captured_queries) <= 30, len(queries.captured_queries)

    # A job that goes first moves everyone else back one place: its own row is written
    # (its reason) and the order once; every position is exact, none of the others' rows
    # is written.
    urgent = make_job(owner, team, time_limit=3600, priority=20)
    third = run_cycle()
    assert third is not None and third.timings["order_written"] == 1
    after = _waits()
    assert third.timings["waits_written"] == 1
    assert [pk for pk in after if pk != urgent.pk and after[pk] != stored[pk]] == []
    moved = queue_positions()
    assert moved[urgent.pk] == 1
    assert all(moved[j.pk] == positions[j.pk] + 1 for j in waiting)


def test_a_position_left_on_a_row_is_cleared_once(owner: Any, team: Any, sent: list[Any]) -> None:
    _use_priority_without_reservation()
    make_running(owner, team, make_node("sim-a", 1), [0], time_limit=3600)
    jobs = [make_job(owner, team, time_limit=3600) for _ in range(3)]
    run_cycle()
    Job.objects.filter(pk=jobs[1].pk).update(queue_position=7)
    cleared = run_cycle()
    assert cleared is not None and cleared.timings["waits_written"] == 1
    assert all(position is None for _, position, _ in _waits().values())
    assert queue_positions() == {j.pk: n for n, j in enumerate(jobs, start=1)}
