"""Celery tasks of the scheduler, consumed by the control worker."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from fleet.celery import CONTROL_QUEUE
from scheduler.cycle.runner import run_cycle


# No acks_late: a lost tick costs nothing, the next one comes within the interval. The
# limits keep a stuck cycle from holding the control worker (and the lock) for long.
@shared_task(
    name="scheduler.tasks.schedule_cycle",
    queue=CONTROL_QUEUE,
    ignore_result=True,
    soft_time_limit=50,
    time_limit=60,
)
def schedule_cycle() -> dict[str, Any] | None:
    record = run_cycle()
    if record is None:
        return None
    return {"cycle": record.pk, "placed": record.placed, "duration_ms": record.duration_ms}
