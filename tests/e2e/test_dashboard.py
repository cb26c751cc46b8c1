"""The dashboard in a real browser: logging in, submitting a job from the form, watching it
go pending -> running -> succeeded on a simulated agent without reloading, reading its log,
cancelling another job, and a member of another team seeing no action buttons.
Screenshots of each page go to var/artifacts/screenshots/."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from fleet.models import Job, JobEvent, Node
from tests.e2e.conftest import Stack, login, screenshot
from tests.factories import JobFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PASSWORD = "pw-for-tests"
# Records every state the job page shows, across htmx swaps, in window.__states.
WATCH_STATES = """() => {
  window.__fleetNoReload = true;
  window.__states = [];
  const note = () => {
    const el = document.getElementById('job-state');
    const s = el && el.textContent.trim();
    if (s && window.__states[window.__states.length - 1] !== s) window.__states.push(s);
  };
  note();
  new MutationObserver(note).observe(document.getElementById('job-live'),
    {childList: true, subtree: true, characterData: true});
}"""


def wait_until(check: Callable[[], Any], what: str, stack: Stack, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{stack.diagnostics()}")


def state_shown(page: Any, state: str, timeout: float = 30_000) -> None:
    page.wait_for_function(
        "s => document.getElementById('job-state').textContent.trim() === s",
        arg=state,
        timeout=timeout,
    )


def submit_job(page: Any, base: str, name: str, command: str) -> int:
    page.goto(f"{base}/submit/")
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Command").fill(command)
    page.get_by_label("GPUs", exact=True).fill("1")
    page.get_by_label("Time limit (seconds)").fill("600")
    page.get_by_label("Environment").fill("GREETING=hello from fleet")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(f"{base}/jobs/*/")
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def test_live_job_on_a_simulated_agent(
    stack: Stack, live_server: Any, new_page: Any, owner: Any, outsider: Any, staff: Any
) -> None:
    base = live_server.url
    node = f"e2e-{uuid.uuid4().hex[:6]}"
    stack.start_agent(node)
    wait_until(
        lambda: Node.objects.filter(name=node, state="up", gpus__isnull=False).exists(),
        f"agent {node} to register",
        stack,
    )
    page = new_page()
    login(page, base, "owner", PASSWORD)

    # Submit from the form; the page then follows the job without a reload.
    job_id = submit_job(page, base, "e2e-hello", 'echo "$GREETING"; sleep 5; echo done')
    page.evaluate(WATCH_STATES)
    state_shown(page, "running")
    state_shown(page, "succeeded")
    seen = page.evaluate("window.__states")
    assert page.evaluate("window.__fleetNoReload") is True, "the page was reloaded"
    assert seen[0] in ("pending", "assigned") and seen[-2:] == ["running", "succeeded"], seen
    applied = list(
        JobEvent.objects.filter(job_id=job_id, applied=True).values_list("to_state", flat=True)
    )
    assert applied == ["pending", "assigned", "running", "succeeded"]

    # Its log, tailed from the logs endpoint.
    page.wait_for_function(
        "() => /hello from fleet\\ndone/.test(document.getElementById('log').textContent)"
    )
    screenshot(page, "job")

    # Another job: cancel it from its page.
    other = submit_job(page, base, "e2e-long", "sleep 300")
    state_shown(page, "running")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel").click()
    state_shown(page, "cancelled")
    assert Job.objects.get(pk=other).state == "cancelled"

    # The fleet, the node and the queue, with the agent's telemetry.
    page.goto(f"{base}/fleet/")
    page.wait_for_selector(f"text={node}")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.tile .util')].some(e => e.textContent.includes('%'))"
    )
    screenshot(page, "fleet")
    page.goto(f"{base}/nodes/{node}/")
    chart_json = page.evaluate(
        f"() => fetch('/nodes/{node}/telemetry.json?range=15m').then(r => r.json())"
    )
    assert chart_json["available"], chart_json
    page.wait_for_selector(".chart .main-svg")
    screenshot(page, "node")
    page.goto(f"{base}/queue/")
    screenshot(page, "queue")
    page.goto(f"{base}/usage/")
    page.wait_for_selector(".chart .main-svg")
    screenshot(page, "usage")

    # A member of another team sees the job, but no buttons.
    theirs = new_page()
    login(theirs, base, "outsider", PASSWORD)
    theirs.goto(f"{base}/jobs/{other}/")
    assert theirs.locator("#job-state").text_content() == "cancelled"
    assert theirs.locator("#job-live button").count() == 0
    assert "Only the job's owner" in theirs.locator("#h-log + p").text_content()


def test_login_submit_errors_and_buttons_by_role(
    live_server: Any, new_page: Any, owner: Any, outsider: Any, staff: Any, team: Any
) -> None:
    base = live_server.url
    page = new_page()
    page.goto(f"{base}/fleet/")
    assert "/login/" in page.url
    page.get_by_label("User name").fill("owner")
    page.get_by_label("Password").fill("wrong")
    page.get_by_role("button", name="Log in").click()
    assert "did not match" in page.locator("[role=alert]").text_content()
    screenshot(page, "login")
    login(page, base, "owner", PASSWORD)

    # A field error from the service shows inline, next to the field.
    page.goto(f"{base}/submit/")
    page.get_by_label("Name", exact=True).fill("too-long")
    page.get_by_label("Command").fill("true")
    page.get_by_label("Time limit (seconds)").fill("9999999")
    page.get_by_role("button", name="Submit job").click()
    error = page.locator(".field-time_limit .error")
    assert "maximum" in error.text_content()
    screenshot(page, "submit")

    # Keyboard: the skip link is the first stop and leads to the content.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"

    job = JobFactory(owner=owner, team=team, name="owned")
    page.goto(f"{base}/jobs/{job.pk}/")
    assert page.get_by_role("button", name="Hold").is_visible()
    page.get_by_role("button", name="Hold").click()
    page.wait_for_function("() => document.getElementById('job-state').textContent === 'held'")

    page.goto(f"{base}/token/")
    page.get_by_role("button", name="Create token").click()
    assert page.locator("#token-key").input_value() in page.locator("#curl-example").text_content()
    screenshot(page, "token")

    other = new_page()
    login(other, base, "outsider", PASSWORD)
    other.goto(f"{base}/jobs/{job.pk}/")
    assert other.locator("#job-live button").count() == 0
    assert other.goto(f"{base}/scheduler/").status == 403

    admin = new_page()
    login(admin, base, "staff", PASSWORD)
    admin.goto(f"{base}/scheduler/")
    assert admin.get_by_label("Active policy").is_visible()
    screenshot(admin, "scheduler")

    stranger = UserFactory(username="nobody")
    assert stranger.pk
    nobody = new_page()
    nobody.goto(f"{base}/login/")
    nobody.get_by_label("User name").fill("nobody")
    nobody.get_by_label("Password").fill(PASSWORD)
    nobody.get_by_role("button", name="Log in").click()
    assert "not a member of any team" in nobody.locator("[role=alert]").text_content()
