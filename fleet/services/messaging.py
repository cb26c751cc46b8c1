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
SCHEDULE_DEBOUNCE_SECONDS = 0.5
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
    window (SCHEDULE_DEBOUNCE_SECONDS) gets a cycle at once, so a job submitted to an idle
    fleet starts without waiting out the window; requests during the window share one more
    cycle at its end, which sees everything they wrote. So a burst of any size costs two
    cycles a window at most, and nothing waits longer than a window. The window lives in
    Redis (milliseconds; Django's cache rounds timeouts down to whole seconds)."""

    def send() -> None:
        global _covered_until
        now = time.time()
        if now < _covered_until:
            return  # this window's closing cycle is already asked for, and will see this commit
        window_ms = int(SCHEDULE_DEBOUNCE_SECONDS * 1000)
        try:
            client = _redis()
            first = bool(client.set(SCHEDULE_DEBOUNCE_KEY, repr(now), nx=True, px=window_ms))
            opened = now if first else float(client.get(SCHEDULE_DEBOUNCE_KEY) or now)
            # The closing cycle runs at the end of the window the first request opened; its
            # key lasts until then, not into the next window (whose closing cycle it would
            # otherwise stand for).
            countdown = min(
                max(SCHEDULE_DEBOUNCE_SECONDS - (now - opened), 0.05), SCHEDULE_DEBOUNCE_SECONDS
            )
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
            _covered_until = opened + SCHEDULE_DEBOUNCE_SECONDS * (1 - SCHEDULE_COVER_MARGIN)
        if first:
            _send(SCHEDULE_TASK, CONTROL_QUEUE, {})
        elif again:
            _send(SCHEDULE_TASK, CONTROL_QUEUE, {}, countdown=countdown)

    transaction.on_commit(send)


def schedule_window_reset() -> None:
    """Forget the current window (tests, and a control worker that starts afresh)."""
    global _covered_until
    _covered_until = 0.0
    _redis().delete(SCHEDULE_DEBOUNCE_KEY, SCHEDULE_TRAILING_KEY)


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
