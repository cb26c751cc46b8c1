"""The policy advisor page in a real browser: a run started from the page shows its progress
moving (the page polls the run's API), then the comparison table, and *Apply* on a row makes
that policy and its weights the scheduler's settings.

The run goes to a control worker of its own (tests/e2e/advisor_worker.py) whose grid is three
candidates, over a history of three jobs, so it ends in seconds."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connections
from django.utils import timezone

from fleet.models import Job, JobEvent
from scheduler import tasks
from scheduler.advisor import runs
from scheduler.cycle import config
from tests.e2e.conftest import login, screenshot
from tests.factories import JobFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-for-tests"


def _ran(
    owner: Any, team: Any, base: Any, submit: float, start: float, end: float, **kw: Any
) -> Job:
    """A job submitted at base + submit that ran from base + start to base + end."""
    job: Job = JobFactory(state="succeeded", owner=owner, team=team, **kw)  # type: ignore[assignment]
    for at, src, dst in ((start, "pending", "assigned"), (start, "assigned", "running"),
                         (end, "running", "succeeded")):  # fmt: skip
        event = JobEvent.objects.create(
            job=job, from_state=src, to_state=dst, attempt=1, actor_kind="scheduler"
        )
        JobEvent.objects.filter(pk=event.pk).update(at=base + timedelta(seconds=at))
    Job.objects.filter(pk=job.pk).update(
        submitted_at=base + timedelta(seconds=submit),
        finished_at=base + timedelta(seconds=end),
        attempt=1,
    )
    return job


@pytest.fixture
def advisor(stack: Any, monkeypatch: Any, fleet_nodes: Any, owner: Any, outsider: Any) -> Any:
    """A staff user, the scheduler on fcfs, three jobs that ran yesterday, and a control
    worker of its own taking the advisor's runs."""
    for key in (runs.ACTIVE_KEY, runs.LATEST_KEY):
        cache.delete(key)
    queue = f"advisor-e2e-{uuid.uuid4().hex[:8]}"
    send = tasks.advisor_run.apply_async
    monkeypatch.setattr(
        tasks.advisor_run, "apply_async", lambda *a, **kw: send(*a, **{**kw, "queue": queue})
    )
    worker = stack.spawn("advisor", [sys.executable, "-m", "tests.e2e.advisor_worker", queue])
    UserFactory(username="boss", is_staff=True, password=PASSWORD)
    config.settings_update(user=None, policy="fcfs")
    base = timezone.now() - timedelta(days=1)
    vision, speech = owner.memberships.get().team, outsider.memberships.get().team
    _ran(owner, vision, base, 0, 0, 100, name="train")
    _ran(owner, vision, base, 10, 100, 150, gpus=2, name="train")
    _ran(outsider, speech, base, 0, 0, 70, gpus=2, name="asr")
    yield worker
    connections.close_all()  # the ORM calls made inside Playwright's context
    import redis

    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(queue)


class Watch:
    """What the page did: the run states its polling read, and its errors (a failed request,
    an error in the console, an uncaught exception), and any dialog it opened."""

    def __init__(self, page: Any) -> None:
        self.polled: list[tuple[str, int]] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.polls = 0  # requests for the run's progress
        page.on("request", self._request)
        page.on("response", self._response)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("console", self._console)
        page.on("dialog", self._dialog)

    def _request(self, request: Any) -> None:
        self.polls += "/api/v1/advisor/runs/" in request.url

    def _response(self, response: Any) -> None:
        if response.status >= 400 and "/advisor/" not in response.url:
            self.errors.append(f"{response.status} {response.url}")
        if "/api/v1/advisor/runs/" in response.url and response.status == 200:
            try:
                run = response.json()
            except Exception:  # noqa: BLE001 - the page reloaded before its body was read
                return
            self.polled.append((run["state"], run["done"]))

    def _console(self, message: Any) -> None:
        # The site has no favicon; the 404 of the browser's own request for one is no error.
        if message.type == "error" and not message.location.get("url", "").endswith("/favicon.ico"):
            self.errors.append(f"{message.text} ({message.location.get('url')})")

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()


# Sets document.visibilityState as a browser does when the tab is hidden or shown again.
SHOW = """state => {
    Object.defineProperty(document, "visibilityState", { value: state, configurable: true });
    document.dispatchEvent(new Event("visibilitychange"));
}"""


def _start(page: Any, base: str, days: str = "3") -> str:
    login(page, base, "boss", PASSWORD)
    page.goto(f"{base}/advisor/")
    page.fill("#id_days", days)
    page.get_by_role("button", name="Run the advisor").click()
    page.wait_for_url("**/advisor/?run=*")
    return page.url.rsplit("run=", 1)[1]


def _wait_for_progress(page: Any) -> None:
    """The bar moves while the worker simulates: one candidate done of three."""
    page.wait_for_function(
        "() => { const p = document.querySelector('#advisor-progress');"
        " return p && p.value >= 1 && p.max === 3; }",
        timeout=60_000,
    )


def test_a_run_started_on_the_page_shows_progress_then_results_and_applies_a_choice(
    advisor: Any, stack: Any, live_server: Any, new_page: Any
) -> None:
    page = new_page()
    watch = Watch(page)
    _start(page, live_server.url)
    assert page.locator("#advisor-progress").count() == 1, stack.diagnostics()
    _wait_for_progress(page)
    assert "of 3 candidates simulated" in page.locator("[data-advisor-status]").inner_text()
    screenshot(page, "advisor-progress")
    table = page.locator("table.advisor-table")
    table.wait_for(timeout=60_000)
    screenshot(page, "advisor-results")
    assert any(state == "running" and 0 < done < 3 for state, done in watch.polled), watch.polled
    rows = table.locator("tbody tr")
    assert rows.count() == 4  # what happened, then the three candidates
    assert "What happened" in rows.nth(0).inner_text()
    assert table.locator("mark").count() >= 1  # the best of each column is marked
    assert page.locator("#advisor-progress").count() == 0
    assert page.input_value("#id_days") == "3"  # the form offers the shown run's window again

    label = f"priority (priority_weight_age={json.dumps(10000.0)})"
    page.get_by_role("button", name=f"Apply {label}").click()
    page.wait_for_url("**/scheduler/")
    assert "The scheduler now uses priority" in page.locator("body").inner_text()
    row = config.settings_get()
    assert row.policy == "priority"
    assert row.params["priority_weight_age"] == 10000.0
    assert advisor.proc.poll() is None, stack.diagnostics()
    assert (watch.errors, watch.dialogs) == ([], [])


def test_a_second_start_while_a_run_is_in_progress_follows_that_run_to_its_results(
    advisor: Any, stack: Any, live_server: Any, new_page: Any
) -> None:
    page = new_page()
    watch = Watch(page)
    first = _start(page, live_server.url)
    page.get_by_role("button", name="Run the advisor").click()
    assert "is already in progress" in page.get_by_role("alert").inner_text()
    _wait_for_progress(page)  # the page refused the second run follows the first
    # Polling pauses while the tab is hidden and starts again when it is shown.
    page.evaluate(SHOW, "hidden")
    polls = watch.polls
    page.wait_for_timeout(4500)  # two polling intervals
    assert watch.polls == polls
    page.evaluate(SHOW, "visible")

    page.locator("table.advisor-table").wait_for(timeout=60_000)

    assert watch.polls > polls
    assert page.url.endswith(f"/advisor/?run={first}")
    assert cache.get(runs.LATEST_KEY) == first  # no second run was started
    assert cache.get(runs.ACTIVE_KEY) is None
    # Settings changed after the run started: its figures no longer hold, apply is refused.
    config.settings_update(user=None, policy="sjf")
    page.get_by_role("button", name="Apply fcfs (current weights)").click()
    page.wait_for_url(f"**/advisor/?run={first}")
    assert "Nothing was applied" in page.locator("body").inner_text()
    assert config.settings_get().policy == "sjf"
    # The browser logs the refused start's 409 (the page's answer to it); nothing else.
    assert [e for e in watch.errors if "status of 409" not in e] == [], watch.errors
    assert len(watch.errors) == 1 and watch.dialogs == []
