"""Messages from the control side to agents and to the scheduler, sent after commit.

Redis is a transport (DESIGN.md rule 1): a message that cannot be sent is logged and
left to the periodic cycle and the reconciliation that follows, never a failed request.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.cache import cache
from django.db import transaction

from fleet.celery import CONTROL_QUEUE, app, node_queue

log = logging.getLogger(__name__)

SCHEDULE_TASK = "scheduler.tasks.schedule_cycle"
SCHEDULE_DEBOUNCE_KEY = "scheduler:cycle-requested"
SCHEDULE_DEBOUNCE_SECONDS = 1


def _send(task: str, queue: str, kwargs: dict[str, Any], countdown: float | None = None) -> None:
    try:
        app.send_task(task, kwargs=kwargs, queue=queue, countdown=countdown)
    except Exception:  # the broker is down: the periodic cycle recovers
        log.warning("could not send %s to %s; the periodic cycle will recover", task, queue)


def send_to_node_on_commit(node_name: str, task: str, **kwargs: Any) -> None:
    transaction.on_commit(lambda: _send(task, node_queue(node_name), kwargs))


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
