"""Messages from the control side to agents and to the scheduler, sent after commit.

Redis is a transport (design rule 1): a message that cannot be sent is logged and
left to the periodic cycle and the reconciliation that follows, never a failed request.
Every message to an agent is signed for its node and expires (fleet.services.wire).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import transaction

from fleet.celery import CONTROL_QUEUE, app, node_queue
from fleet.services import wire

log = logging.getLogger(__name__)

SCHEDULE_TASK = "scheduler.tasks.schedule_cycle"
SCHEDULE_DEBOUNCE_KEY = "fleet:scheduler:cycle-requested"
SCHEDULE_TRAILING_KEY = "fleet:scheduler:cycle-requested-again"
SCHEDULE_WINDOW_KEY = "fleet:scheduler:window-seconds"
# The window until the control worker has timed a cycle (and when Redis lost the timing).
SCHEDULE_DEBOUNCE_SECONDS = 0.5
# The window follows the cost of a cycle: SCHEDULE_WINDOW_PER_CYCLE times the last cycle's
# duration, within these bounds. A burst costs at most two cycles a window, so requests keep
# the control worker at most two thirds busy however large the fleet, and on a small fleet
# (cycles of tens of milliseconds) a job submitted just after another ended waits a short
# window, not half a second.
SCHEDULE_WINDOW_PER_CYCLE = 3.0
SCHEDULE_WINDOW_MIN_S = 0.1
SCHEDULE_WINDOW_MAX_S = 2.0
# How long a process keeps the window it read before reading it again.
SCHEDULE_WINDOW_REFRESH_S = 5.0
_window_read: tuple[float, float] | None = None  # (read at, seconds)
# Until when (time.time()) this process knows that the current window's closing cycle is
# already asked for; a burst of submits then costs Redis a few commands a window, not three
# a submit. The margin (a share of the window) keeps clear of that cycle's start.
_covered_until = 0.0
SCHEDULE_COVER_MARGIN = 0.2


def _send(task: str, queue: str, kwargs: dict[str, Any], countdown: float | None = None) -> None:
    try:
        app.send_task(task, kwargs=kwargs, queue=queue, countdown=countdown)
    except Exception:  # the broker is down: the periodic cycle recovers
        log.warning("could not send %s to %s; the periodic cycle will recover", task, queue)


def send_to_node_on_commit(
    node_name: str, task: str, *, ttl: float = wire.COMMAND_TTL_S, **kwargs: Any
) -> None:
    """After commit, send `task` with `kwargs` to the node's agent, signed and good for
    `ttl` seconds from the moment it is sent."""

    def send() -> None:
        envelope = wire.seal_for_node(node=node_name, task=task, args=kwargs, ttl=ttl)
        _send(task, node_queue(node_name), envelope)

    transaction.on_commit(send)


def request_schedule() -> None:
    """Ask for a scheduling cycle; bursts of requests collapse. The first request of a
    window (schedule_window_fit) gets a cycle at once, so a job submitted to an idle
    fleet starts without waiting out the window; requests during the window share one more
    cycle at its end, which sees everything they wrote. So a burst of any size costs two
    cycles a window at most, and nothing waits longer than a window. The window lives in
    Redis (milliseconds; Django's cache rounds timeouts down to whole seconds)."""

    def send() -> None:
        global _covered_until
        now = time.time()
        if now < _covered_until:
            return  # this window's closing cycle is already asked for, and will see this commit
        try:
            client = _redis()
            window = _window(client, now)
            window_ms = int(window * 1000)
            first = bool(client.set(SCHEDULE_DEBOUNCE_KEY, repr(now), nx=True, px=window_ms))
            opened = now if first else float(client.get(SCHEDULE_DEBOUNCE_KEY) or now)
            # The closing cycle runs at the end of the window the first request opened; its
            # key lasts until then, not into the next window (whose closing cycle it would
            # otherwise stand for).
            countdown = min(max(window - (now - opened), 0.05), window)
            again = not first and bool(
                client.set(SCHEDULE_TRAILING_KEY, 1, nx=True, px=int(countdown * 1000))
            )
        except Exception:
            log.warning("Redis unavailable; the periodic cycle will schedule")
            return
        if not first:
            # The cycle at the window's end is asked for (now, or by another request): the
            # rest of this process's requests in the window need not ask Redis again, up to
            # a margin before that cycle (clocks of other hosts may differ a little).
            _covered_until = opened + window * (1 - SCHEDULE_COVER_MARGIN)
        if first:
            _send(SCHEDULE_TASK, CONTROL_QUEUE, {})
        elif again:
            _send(SCHEDULE_TASK, CONTROL_QUEUE, {}, countdown=countdown)

    transaction.on_commit(send)


def schedule_window_fit(cycle_seconds: float) -> float:
    """Set the window from the duration of the cycle that just ran (the control worker calls
    this after each cycle); returns the window. A failure to store it only keeps the last
    window: the window is a rate limit, not state."""
    window = min(
        max(cycle_seconds * SCHEDULE_WINDOW_PER_CYCLE, SCHEDULE_WINDOW_MIN_S), SCHEDULE_WINDOW_MAX_S
    )
    try:
        _redis().set(SCHEDULE_WINDOW_KEY, repr(window), ex=3600)
    except Exception:
        log.warning("Redis unavailable; the scheduling window keeps its last length")
    return window


def _window(client: Any, now: float) -> float:
    """The current window in seconds: the one the control worker last set, read again
    every SCHEDULE_WINDOW_REFRESH_S; SCHEDULE_DEBOUNCE_SECONDS while none is set."""
    global _window_read
    if _window_read is not None and 0 <= now - _window_read[0] < SCHEDULE_WINDOW_REFRESH_S:
        return _window_read[1]
    raw = client.get(SCHEDULE_WINDOW_KEY)
    try:
        window = min(max(float(raw), SCHEDULE_WINDOW_MIN_S), SCHEDULE_WINDOW_MAX_S)
    except (TypeError, ValueError):  # none set yet, or not a number
        window = SCHEDULE_DEBOUNCE_SECONDS
    _window_read = (now, window)
    return window


def schedule_window_reset() -> None:
    """Forget the current window and its length (tests, and a control worker that starts
    afresh)."""
    global _covered_until, _window_read
    _covered_until = 0.0
    _window_read = None
    _redis().delete(SCHEDULE_DEBOUNCE_KEY, SCHEDULE_TRAILING_KEY, SCHEDULE_WINDOW_KEY)


_client: Any = None


def _redis() -> Any:
    global _client
    if _client is None:
        import redis

        _client = redis.Redis.from_url(
            settings.REDIS_URL, **getattr(settings, "REDIS_SSL_OPTIONS", {})
        )
    return _client


def redis_client() -> Any:
    """This process's kept Redis client (the Redis of the broker and the cache), for reads
    on every request where Django's cache would build a client per call."""
    return _redis()


# Tasks that agents run (workers/tasks.py), named here so the control side never imports them.
START_JOB_TASK = "workers.tasks.start_job"
STOP_JOB_TASK = "workers.tasks.stop_job"
