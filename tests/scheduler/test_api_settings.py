from __future__ import annotations

from typing import Any

import pytest
from django_celery_beat.models import PeriodicTask

from scheduler.cycle.config import TICK_TASK_NAME, ensure_defaults
from scheduler.cycle.runner import run_cycle
from scheduler.models import SchedulerSettings
from scheduler.policies import policy_names

pytestmark = pytest.mark.django_db

URL = "/api/v1/scheduler/"


def test_members_read_the_settings_and_strangers_are_refused(
    owner_api: Any, stranger_api: Any, anon_api: Any
) -> None:
    body = owner_api.get(URL).json()
    assert body["policy"] == "gittins-tiers" and body["tick_seconds"] == 10
    assert body["policies"] == policy_names()
    assert body["known_params"]["fairshare_half_life"]["type"] == "number"
    assert body["known_params"]["priority_weight_age"]["default"] == 1000.0
    assert stranger_api.get(URL).status_code == 403
    assert anon_api.get(URL).status_code in (401, 403)


def test_only_staff_may_change_them(owner_api: Any, team_admin_api: Any) -> None:
    for api in (owner_api, team_admin_api):
        response = api.patch(URL, {"policy": "fcfs"}, format="json")
        assert response.status_code == 403
        assert response.json()["message"] == "Only staff may change the scheduler's settings."
    assert SchedulerSettings.objects.get().policy == "gittins-tiers"


def test_unknown_policy_is_refused_with_the_names(staff_api: Any) -> None:
    response = staff_api.patch(URL, {"policy": "lottery"}, format="json")
    assert response.status_code == 400
    message = response.json()["message"]
    assert message.startswith('Unknown policy "lottery". Known policies: fcfs, priority, sjf')
    assert response.json()["extra"]["policies"] == policy_names()


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"preemption": "yes"}, "parameter preemption must be true or false; got \"yes\""),
        ({"fairshare_half_life": "a day"}, "parameter fairshare_half_life must be a number"),
        ({"fairshare_half_life": 0}, "parameter fairshare_half_life must be at least 1"),
        ({"ilp_time_limit": [1]}, "parameter ilp_time_limit must be a number"),
        ({"max_preemptions_per_cycle": 2.5}, "must be a whole number; got 2.5"),
        ({"backfill_order": "random"}, "must be one of priority, submit"),
        ({"priority_wieght_age": 1}, "unknown parameter priority_wieght_age; known: "),
        ({"qos_ranks": {"high": "top"}}, "an object mapping QoS names to whole numbers"),
    ],
)  # fmt: skip
def test_bad_parameters_are_refused(staff_api: Any, params: dict[str, Any], needle: str) -> None:
    response = staff_api.patch(URL, {"params": params}, format="json")
    assert response.status_code == 400, response.json()
    assert needle in response.json()["message"]
    assert "params" in response.json()["extra"]["fields"]
    assert SchedulerSettings.objects.get().params == {}


def test_a_change_takes_effect_at_the_next_cycle_and_moves_the_tick(
    staff_api: Any, owner: Any, team: Any
) -> None:
    ensure_defaults()
    ensure_defaults()  # idempotent: one task, one row
    assert PeriodicTask.objects.filter(name=TICK_TASK_NAME).count() == 1
    assert run_cycle().policy == "gittins-tiers"  # type: ignore[union-attr]
    response = staff_api.patch(
        URL,
        {"policy": "fcfs", "params": {"fairshare_half_life": 7200, "preemption": False}, "tick_seconds": 30},
        format="json",
    )  # fmt: skip
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["policy"] == "fcfs" and body["tick_seconds"] == 30
    assert body["params"] == {"fairshare_half_life": 7200, "preemption": False}
    assert body["updated_by"] == "staff"
    # PATCH merges parameters; null removes one.
    body = staff_api.patch(URL, {"params": {"preemption": None}}, format="json").json()
    assert body["params"] == {"fairshare_half_life": 7200}
    tick = PeriodicTask.objects.get(name=TICK_TASK_NAME)
    assert (tick.interval.every, tick.interval.period, tick.queue) == (30, "seconds", "control")
    assert tick.task == "scheduler.tasks.schedule_cycle"
    record = run_cycle()
    assert record is not None and record.policy == "fcfs"
    assert staff_api.get(URL).json()["last_cycle"]["policy"] == "fcfs"


def test_tick_seconds_out_of_range_is_refused(staff_api: Any) -> None:
    response = staff_api.patch(URL, {"tick_seconds": 0}, format="json")
    assert response.status_code == 400
    assert "tick_seconds" in response.json()["extra"]["fields"]
