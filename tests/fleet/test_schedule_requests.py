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
