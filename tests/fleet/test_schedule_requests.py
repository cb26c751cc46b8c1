"""Asking for scheduling cycles: the first request of a window runs a cycle at once (a job
on an idle fleet does not wait out the window), the rest of the window shares one more."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.services import messaging

pytestmark = pytest.mark.django_db


def test_first_request_now_the_rest_of_the_window_once_after_it(
    monkeypatch: Any, django_capture_on_commit_callbacks: Any
) -> None:
    messaging.schedule_window_reset()
    sent: list[tuple[str, float | None]] = []
    monkeypatch.setattr(
        messaging,
        "_send",
        lambda task, queue, kwargs, countdown=None: sent.append((task, countdown)),
    )
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(20):
            messaging.request_schedule()
    assert [task for task, _ in sent] == [messaging.SCHEDULE_TASK] * 2
    assert sent[0][1] is None  # at once
    assert 0 < sent[1][1] <= messaging.SCHEDULE_DEBOUNCE_SECONDS  # at the window's end
    # A new window starts over.
    messaging.schedule_window_reset()
    with django_capture_on_commit_callbacks(execute=True):
        messaging.request_schedule()
    assert sent[-1] == (messaging.SCHEDULE_TASK, None) and len(sent) == 3


def test_a_cycle_that_finds_the_lock_held_asks_again(
    monkeypatch: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from scheduler import tasks

    messaging.schedule_window_reset()
    sent: list[str] = []
    monkeypatch.setattr(
        messaging, "_send", lambda task, queue, kwargs, countdown=None: sent.append(task)
    )
    monkeypatch.setattr(tasks, "run_cycle", lambda: None)  # another cycle holds the lock
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.schedule_cycle.run() is None
    assert sent == [messaging.SCHEDULE_TASK]


def _requests_sent(monkeypatch: Any, capture: Any, count: int) -> list[float | None]:
    sent: list[float | None] = []
    monkeypatch.setattr(
        messaging, "_send", lambda task, queue, kwargs, countdown=None: sent.append(countdown)
    )
    with capture(execute=True):
        for _ in range(count):
            messaging.request_schedule()
    return sent


def test_the_window_follows_the_cost_of_a_cycle(
    monkeypatch: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # Cheap cycles (a small fleet): a short window, so a job submitted just after another
    # ended does not wait half a second for the window's closing cycle.
    messaging.schedule_window_reset()
    assert messaging.schedule_window_fit(0.02) == messaging.SCHEDULE_WINDOW_MIN_S
    sent = _requests_sent(monkeypatch, django_capture_on_commit_callbacks, 5)
    assert sent[0] is None and 0 < sent[1] <= messaging.SCHEDULE_WINDOW_MIN_S  # type: ignore[operator]
    # Costly cycles (a large queue): a longer window keeps requests from queueing cycles
    # faster than the control worker runs them.
    messaging.schedule_window_reset()
    assert messaging.schedule_window_fit(0.4) == pytest.approx(1.2)
    sent = _requests_sent(monkeypatch, django_capture_on_commit_callbacks, 5)
    assert sent[0] is None and 1.0 < sent[1] <= 1.2  # type: ignore[operator]
    # Never beyond the upper bound, and a window Redis cannot read is the default one.
    assert messaging.schedule_window_fit(60.0) == messaging.SCHEDULE_WINDOW_MAX_S
    messaging.schedule_window_reset()
    messaging._redis().set(messaging.SCHEDULE_WINDOW_KEY, b"not a number")
    sent = _requests_sent(monkeypatch, django_capture_on_commit_callbacks, 5)
    assert 0.4 < sent[1] <= messaging.SCHEDULE_DEBOUNCE_SECONDS  # type: ignore[operator]
    messaging.schedule_window_reset()


def test_each_cycle_sets_the_window_from_its_duration(monkeypatch: Any) -> None:
    from types import SimpleNamespace

    from scheduler import tasks

    messaging.schedule_window_reset()
    record = SimpleNamespace(pk=1, placed=0, duration_ms=100.0)
    monkeypatch.setattr(tasks, "run_cycle", lambda: record)
    tasks.schedule_cycle.run()
    assert float(messaging._redis().get(messaging.SCHEDULE_WINDOW_KEY)) == pytest.approx(0.3)
    messaging.schedule_window_reset()
