"""A burst of scheduling requests: once the window's closing cycle is asked for, the
process's further requests in that window cost Redis nothing; after it, they ask again."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from fleet.services import messaging

pytestmark = pytest.mark.django_db


class CountingRedis:
    def __init__(self, client: Any) -> None:
        self.client, self.commands = client, 0

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.client, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.commands += 1
            return call(*args, **kwargs)

        return counted


@pytest.fixture
def fresh_window() -> Iterator[None]:
    messaging.schedule_window_reset()
    yield
    messaging.schedule_window_reset()  # no long window left behind for other tests


def test_requests_inside_a_covered_window_skip_redis(
    monkeypatch: Any, django_capture_on_commit_callbacks: Any, fresh_window: None
) -> None:
    # A long window, so that the keys in (real) Redis outlast the test on a slow machine.
    monkeypatch.setattr(messaging, "SCHEDULE_DEBOUNCE_SECONDS", 60.0)
    clock = SimpleNamespace(now=1_000_000.0)
    monkeypatch.setattr(messaging, "time", SimpleNamespace(time=lambda: clock.now))
    redis = CountingRedis(messaging._redis())
    monkeypatch.setattr(messaging, "_redis", lambda: redis)
    sent: list[float | None] = []
    monkeypatch.setattr(
        messaging, "_send", lambda task, queue, kwargs, countdown=None: sent.append(countdown)
    )

    def request(at: float) -> None:
        clock.now = 1_000_000.0 + at
        with django_capture_on_commit_callbacks(execute=True):
            messaging.request_schedule()

    request(0.0)  # opens the window: a cycle now
    request(10.0)  # asks for the closing cycle
    assert len(sent) == 2 and sent[0] is None and sent[1] == pytest.approx(50.0)
    # The closing cycle's key lasts until that cycle, not into the next window.
    assert 49_000 < messaging._redis().pttl(messaging.SCHEDULE_TRAILING_KEY) <= 50_000
    used = redis.commands
    for at in (11.0, 20.0, 30.0, 47.0):
        request(at)
    assert redis.commands == used and len(sent) == 2
    # Near the window's end the process asks Redis again (the cycle may be starting).
    request(49.0)
    assert redis.commands > used and len(sent) == 2
