"""Messages from the control side to agents and to the scheduler, sent after commit.

Redis is a transport (design rule 1): a message that cannot be sent is logged and
left to the periodic cycle and the reconciliation that follows, never a failed request.
Every message to an agent is signed for its node and expires (fleet.services.wire).
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.cache import cache
from django.db import transaction

from fleet.celery import CONTROL_QUEUE, app, node_queue
from fleet.services import wire

log = logging.getLogger(__name__)

SCHEDULE_TASK = "scheduler.tasks.schedule_cycle"
SCHEDULE_DEBOUNCE_KEY = "scheduler:cycle-requested"
SCHEDULE_DEBOUNCE_SECONDS = 1


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
    """Ask for a scheduling cycle soon; bursts of requests collapse into one cycle."""

    def send() -> None:
        try:
            first = cache.add(SCHEDULE_DEBOUNCE_KEY, 1, timeout=SCHEDULE_DEBOUNCE_SECONDS)
        except Exception:
            log.warning("cache unavailable; the periodic cycle will schedule")
            return
        if first:
            _send(SCHEDULE_TASK, CONTROL_QUEUE, {}, countdown=SCHEDULE_DEBOUNCE_SECONDS)

    transaction.on_commit(send)


# Tasks that agents run (workers/tasks.py), named here so the control side never imports them.
START_JOB_TASK = "workers.tasks.start_job"
STOP_JOB_TASK = "workers.tasks.stop_job"
