"""The scheduler settings page: a form generated from the parameters the policies read,
checked by the same service the API uses, and a "Recent cycles" table that refreshes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from scheduler.cycle import config
from scheduler.cycle.runner import run_cycle
from scheduler.cycle.snapshot import build_snapshot
from scheduler.models import CycleRecord
from scheduler.policies import policy_names

pytestmark = pytest.mark.django_db


def _post(client: Client, **fields: Any) -> Any:
    row = config.settings_get()
    data = {"policy": row.policy, "tick_seconds": str(row.tick_seconds), **fields}
    return client.post("/scheduler/", data)


def test_form_has_a_field_for_every_parameter_of_every_policy(staff_web: Client) -> None:
    for policy in policy_names():
        config.settings_update(user=None, policy=policy)
        html = staff_web.get("/scheduler/").content.decode()
        names = set(re.findall(r'name="([a-z0-9_]+)"', html))
        assert set(config.known_params()) <= names, policy
        assert re.search(rf'<option value="{policy}" selected>', html)
    # Each field carries its range and help from the parameter definitions.
    spec = config.known_params()["ilp_time_limit"]
    assert f'max="{spec.maximum:g}"' in html
    assert config.COMMON["fairshare_half_life"].help.rstrip(".") in html


def test_active_policy_opens_the_groups_it_reads(staff_web: Client) -> None:
    config.settings_update(user=None, policy="ilp")
    html = staff_web.get("/scheduler/").content.decode()
    assert re.search(r'data-group="ilp"[^>]*open>', html)
    assert not re.search(r'data-group="genetic"[^>]*open>', html)


def test_a_policys_own_parameters_sit_in_its_group_not_in_every_policys(
    staff_web: Client,
) -> None:
    config.settings_update(user=None, policy="gittins")
    html = staff_web.get("/scheduler/").content.decode()
    assert re.search(r'data-group="gittins"[^>]*open>', html)
    assert not re.search(r'data-group="tiresias"[^>]*open>', html)
    groups = re.split(r'data-group="', html)
    shared = next(g for g in groups if g.startswith("shared"))
    gittins = next(g for g in groups if g.startswith("gittins"))
    assert "gittins_margin" in gittins and "gittins_margin" not in shared
    assert "preemption_cost_weight" in shared


def test_a_bad_value_gets_its_sentence_next_to_the_field_and_changes_nothing(
    staff_web: Client,
) -> None:
    config.settings_update(user=None, policy="fcfs", params={"seed": 3}, tick_seconds=10)
    response = _post(staff_web, policy="ilp", tick_seconds="20", ilp_time_limit="9000", seed="4")
    assert response.status_code == 400
    html = response.content.decode()
    assert "Nothing was saved" in html
    assert re.search(
        r'id="id_ilp_time_limit_error">Parameter ilp_time_limit must be at least 0 and at '
        r"most 600; got 9000\.<",
        html,
    )
    # The group of the submitted policy, where the error is, is unfolded.
    assert re.search(r'data-group="ilp"[^>]*open>', html)
    row = config.settings_get()
    assert (row.policy, row.params, row.tick_seconds) == ("fcfs", {"seed": 3}, 10)


@pytest.mark.parametrize(
    ("field", "text", "sentence"),
    [
        ("priority_reservation", "maybe", "must be true or false"),
        ("seed", "1.5", "must be a whole number"),
        ("las_queue_thresholds", "10, ten", "must be a list of numbers"),
        ("qos_ranks", "low=0, high", "must be an object mapping QoS names"),
        ("tick_seconds", "0", "whole number of seconds from 1 to"),
    ],
)
def test_each_kind_refuses_what_it_cannot_take(
    staff_web: Client, field: str, text: str, sentence: str
) -> None:
    before = config.settings_get()
    response = _post(staff_web, **{field: text})
    assert response.status_code == 400
    assert sentence in response.content.decode()
    after = config.settings_get()
    assert (after.params, after.tick_seconds) == (before.params, before.tick_seconds)


def test_a_good_value_is_saved_and_the_next_cycle_uses_it(staff_web: Client) -> None:
    response = _post(
        staff_web,
        policy="priority",
        tick_seconds="15",
        priority_weight_age="250.5",
        priority_reservation="false",
        las_queue_thresholds="10, 100.5",
        qos_ranks="low=0, high=2",
        backfill_order="submit",
    )
    assert response.status_code == 302
    row = config.settings_get()
    assert row.policy == "priority" and row.tick_seconds == 15
    assert row.params == {
        "priority_weight_age": 250.5,
        "priority_reservation": False,
        "las_queue_thresholds": [10, 100.5],
        "qos_ranks": {"low": 0, "high": 2},
        "backfill_order": "submit",
    }
    assert row.updated_by == "staff"
    settings = build_snapshot().core.settings
    assert settings["priority_weight_age"] == 250.5 and settings["priority_reservation"] is False
    record = run_cycle()
    assert record is not None and record.policy == "priority"
    # The saved values come back in the form; a field emptied again returns to the default.
    html = staff_web.get("/scheduler/").content.decode()
    assert 'value="250.5"' in html and 'value="low=0, high=2"' in html
    assert _post(staff_web, qos_ranks="").status_code == 302
    assert config.settings_get().params == {}


def test_non_staff_are_refused(owner_web: Client) -> None:
    assert owner_web.get("/scheduler/").status_code == 403
    response = owner_web.post("/scheduler/", {"policy": "fcfs", "tick_seconds": "1"})
    assert response.status_code == 403
    assert owner_web.get("/scheduler/?partial=1").status_code == 403


def test_recent_cycles_partial_returns_new_rows(staff_web: Client) -> None:
    page = staff_web.get("/scheduler/").content.decode()
    assert 'hx-get="/scheduler/?partial=1"' in page and "every 2s" in page
    empty = staff_web.get("/scheduler/?partial=1", HTTP_HX_REQUEST="true").content.decode()
    assert "No scheduling cycle recorded yet" in empty and "<tbody>" not in empty
    config.settings_update(user=None, policy="sjf")
    run_cycle()
    run_cycle()
    html = staff_web.get("/scheduler/?partial=1", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in html
    assert html.count("<tr><td>") == CycleRecord.objects.count() == 2
    assert "<td>sjf</td>" in html


def test_advanced_json_is_checked_by_the_same_service(staff_web: Client) -> None:
    config.settings_update(user=None, params={"seed": 3})
    response = staff_web.post("/scheduler/", {"params": '{"seed": -1, "no_such": 1}'})
    assert response.status_code == 400
    html = response.content.decode()
    assert "unknown parameter no_such" in html and "parameter seed must be at least 0" in html
    assert config.settings_get().params == {"seed": 3}
    assert staff_web.post("/scheduler/", {"params": '{"seed": 5}'}).status_code == 302
    assert config.settings_get().params == {"seed": 5}


def test_a_save_from_a_page_older_than_the_last_change_is_refused(staff_web: Client) -> None:
    html = staff_web.get("/scheduler/").content.decode()
    loaded = re.search(r'name="loaded" value="([^"]+)"', html)
    assert loaded is not None
    # Another admin saves while this page is open.
    admin = type("Admin", (), {"get_username": lambda self: "alice"})()
    config.settings_update(user=admin, params={"seed": 9})
    response = _post(staff_web, loaded=loaded.group(1), seed="1")
    assert response.status_code == 400
    assert "alice changed the settings at" in response.content.decode()
    assert config.settings_get().params == {"seed": 9}
    # Sending the same form again is refused again: only a reload shows alice's values.
    assert _post(staff_web, loaded=loaded.group(1), seed="1").status_code == 400
    reloaded = staff_web.get("/scheduler/").content.decode()
    fresh = re.search(r'name="loaded" value="([^"]+)"', reloaded)
    assert fresh is not None and fresh.group(1) != loaded.group(1)
    assert _post(staff_web, loaded=fresh.group(1), seed="1").status_code == 302
    assert config.settings_get().params == {"seed": 1}
