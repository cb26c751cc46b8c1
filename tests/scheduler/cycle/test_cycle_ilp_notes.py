"""The cycle record says when the ILP did not solve and the plan is greedy's."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.models import Job, JobState
from scheduler.cycle.config import settings_get, settings_update
from scheduler.cycle.runner import run_cycle
from tests.scheduler.cycle.conftest import make_job, make_node

pytestmark = pytest.mark.django_db


def _use_ilp(**params: Any) -> None:
    row = settings_get()
    row.policy = "ilp"
    row.save()
    settings_update(user=None, params=params)


def test_a_fallback_to_greedy_is_in_the_cycle_record(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    _use_ilp(ilp_max_nodes=1)
    make_node("sim-a", 4)
    make_node("sim-b", 4)
    make_job(owner, team)
    record = run_cycle()
    assert record is not None and record.placed == 1
    assert Job.objects.filter(state=JobState.ASSIGNED).count() == 1
    assert any(
        n.startswith("ilp: fell back to greedy: 1 placeable jobs x 2 nodes is above the size limit")
        for n in record.notes
    ), record.notes


def test_a_solved_cycle_has_no_fallback_note(owner: Any, team: Any, sent: list[Any]) -> None:
    _use_ilp()
    make_node("sim-a", 4)
    make_job(owner, team)
    record = run_cycle()
    assert record is not None and record.placed == 1
    assert not [n for n in record.notes if n.startswith("ilp:")], record.notes
