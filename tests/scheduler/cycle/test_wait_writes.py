"""What a cycle writes for waiting jobs: reasons and ETAs when they change, positions when
they moved by at least POSITION_SLACK of themselves (every place within the first hundred)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Job, JobState
from scheduler.cycle.apply import POSITION_SLACK, position_moved
from scheduler.cycle.config import settings_get
from scheduler.cycle.runner import run_cycle
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = pytest.mark.django_db


def test_a_position_is_rewritten_once_it_moved_by_the_slack() -> None:
    assert POSITION_SLACK == 0.01
    assert position_moved(None, 7)
    assert not position_moved(1, 1) and not position_moved(5000, 5000)
    # Within the first hundred places, every place counts.
    assert position_moved(1, 2) and position_moved(99, 98) and position_moved(100, 101)
    # Further back, 1 % of the stored position.
    assert not position_moved(5000, 5049) and not position_moved(5000, 4951)
    assert position_moved(5000, 5050) and position_moved(5000, 4950)


def _waits() -> dict[int, tuple[str, Any, Any]]:
    rows = Job.objects.filter(state=JobState.PENDING).values_list(
        "id", "state_reason", "queue_position", "eta"
    )
    return {job_id: (reason, position, eta) for job_id, reason, position, eta in rows}


def test_a_second_cycle_with_nothing_changed_writes_no_waiting_row(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    row = settings_get()
    row.policy = "priority"
    # No reservation: reasons do not name the first in line, so they stay as they are.
    row.params = {**(row.params or {}), "eta_interval": 3600, "priority_reservation": False}
    row.save()
    make_running(owner, team, make_node("sim-a", 1), [0], time_limit=3600)
    waiting = [make_job(owner, team, time_limit=3600) for _ in range(150)]
    first = run_cycle()
    assert first is not None and first.placed == 0
    assert first.timings["waits_written"] == 150
    stored = _waits()
    assert sorted(p for _, p, _ in stored.values()) == list(range(1, 151))

    with CaptureQueriesContext(connection) as queries:
        second = run_cycle()
    assert second is not None and second.timings["waits_written"] == 0
    assert _waits() == stored
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert not any("fleet_job" in sql for sql in updates), updates
    assert len(queries.captured_queries) <= 30, len(queries.captured_queries)

    # A job that goes first moves everyone else back one place: only those whose place
    # changed by 1 % or more (the first hundred, of positions 1..100) are written, not all.
    urgent = make_job(owner, team, time_limit=3600, priority=20)
    third = run_cycle()
    assert third is not None
    after = _waits()
    assert after[urgent.pk][1] == 1
    moved = [j.pk for j in waiting if after[j.pk] != stored[j.pk]]
    assert third.timings["waits_written"] == 1 + len(moved)
    assert len(moved) == 100, len(moved)
    assert all(after[pk][1] == stored[pk][1] + 1 for pk in moved)
    # The rest keep their stored place, one behind at most.
    assert all(after[j.pk][1] == stored[j.pk][1] for j in waiting if j.pk not in moved)
