"""The scheduler settings page in a real browser: the policy picker opens the groups of
parameters it reads, a refused value is shown next to its field, and cycles recorded while
the page is open appear without a reload."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections

from scheduler.cycle import config
from scheduler.cycle.runner import run_cycle
from tests.e2e.conftest import login
from tests.factories import UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-for-tests"


def test_picker_opens_its_groups_errors_show_by_field_and_new_cycles_appear(
    live_server: Any, new_page: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's loop thread
    UserFactory(username="boss", is_staff=True, password=PASSWORD)
    config.settings_update(user=None, policy="fcfs")
    base = live_server.url
    try:
        page = new_page()
        login(page, base, "boss", PASSWORD)
        page.goto(f"{base}/scheduler/")
        ilp = page.locator('details[data-group="ilp"]')
        assert ilp.get_attribute("open") is None
        page.select_option("#id_policy", "ilp")
        assert ilp.evaluate("d => d.open") is True
        assert page.locator('details[data-group="genetic"]').evaluate("d => d.open") is False
        page.fill("#id_ilp_time_limit", "9000")
        page.get_by_role("button", name="Save settings").click()
        error = page.locator("#id_ilp_time_limit_error")
        assert "at most 600; got 9000" in error.inner_text()
        assert config.settings_get().policy == "fcfs"
        table = page.locator("#scheduler-cycles")
        assert "No scheduling cycle recorded yet" in table.inner_text()
        run_cycle()
        page.wait_for_function(
            "() => document.querySelectorAll('#scheduler-cycles tbody tr').length === 1"
        )
    finally:
        # Inside Playwright's context the ORM used connections of their own: close them.
        connections.close_all()
