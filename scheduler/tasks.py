"""Celery tasks of the scheduler, consumed by the control worker."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from fleet.celery import CONTROL_QUEUE
from fleet.services.messaging import request_schedule, schedule_window_fit
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
        # Another cycle holds the lock and may have read the queue before what asked for
        # this one was written: ask again (collapsed with other requests), so nothing waits
        # for the periodic tick.
        request_schedule()
        return None
    schedule_window_fit(record.duration_ms / 1000)
    return {"cycle": record.pk, "placed": record.placed, "duration_ms": record.duration_ms}


# One advisor run: every candidate policy over the recorded jobs, progress in the cache. Not
# acks_late: a run lost with its worker is started again by hand, never twice by Redis.
@shared_task(
    name="scheduler.tasks.advisor_run",
    queue=CONTROL_QUEUE,
    ignore_result=True,
    soft_time_limit=3540,
    time_limit=3600,
)
def advisor_run(*, run_id: str) -> str | None:
    from scheduler.advisor.runs import advisor_run_execute

    run = advisor_run_execute(run_id=run_id)
    return None if run is None else str(run["state"])
