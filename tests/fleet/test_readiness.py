"""/readyz: ready only when the control worker, beat and at least one agent are there."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core.cache import cache

from fleet.api import ready

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker_answers(monkeypatch: Any) -> None:
    # The test runs no control worker; the ping is the only part stood in for.
    monkeypatch.setattr(ready, "_control_worker", lambda: (True, "1 answering"))


def test_ready_needs_no_login_and_says_what_is_missing(client: Any) -> None:
    cache.delete(ready.REAPER_RAN_KEY)
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not ready"
    assert body["database"] == "ok" and body["redis"] == "ok"
    assert body["control_worker"] == "no control worker answered a ping"
    assert body["beat"] == "the reaper has never run: is beat running?"
    assert body["agents"] == "no agent has registered a node that is up"


def test_a_dead_beat_is_reported_and_a_ticking_one_is_ready(
    client: Any, fleet_nodes: Any, worker_answers: None
) -> None:
    ready.reaper_ran(now=time.time() - 120)
    body = client.get("/readyz").json()
    assert body["beat"] == "the reaper last ran 120 s ago: is beat running?"
    assert body["status"] == "not ready"
    ready.reaper_ran()
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json()["agents"] == "2 node(s) up"
    cache.delete(ready.REAPER_RAN_KEY)


def test_the_reaper_task_records_that_beat_ticked() -> None:
    from fleet import tasks

    cache.delete(ready.REAPER_RAN_KEY)
    tasks.reap_nodes.run()
    assert time.time() - cache.get(ready.REAPER_RAN_KEY) < 5
