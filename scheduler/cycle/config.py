"""The scheduler's settings: the active policy, its parameters, and the tick interval.

Parameters are checked against what the registered policies read
(`scheduler.cycle.params`), so a typo or a wrong type is refused with a sentence rather
than ignored by the next cycle. The tick interval lives in a django_celery_beat
PeriodicTask ("scheduler tick"), kept in step with the settings row so beat picks a change
up without a restart.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from fleet.celery import CONTROL_QUEUE
from fleet.errors import ApplicationError
from scheduler.cycle.params import (  # noqa: F401 - the settings' catalogue, re-exported
    COMMON,
    DAY,
    DEFAULT_RANGES,
    MAX_LIST_ITEMS,
    MAX_RANK,
    RANGES,
    YEAR,
    Param,
    known_params,
    validate_params,
)
from scheduler.models import DEFAULT_POLICY, DEFAULT_TICK_SECONDS, SchedulerSettings
from scheduler.policies import policy_names

TICK_TASK_NAME = "scheduler tick"
CYCLE_TASK = "scheduler.tasks.schedule_cycle"
SETTINGS_PK = 1
MAX_TICK_SECONDS = 3600


def validate_policy(name: Any) -> str:
    names = policy_names()
    if not isinstance(name, str) or name not in names:
        raise ApplicationError(
            f"Unknown policy {json.dumps(name)}. Known policies: {', '.join(names)}.",
            {"fields": {"policy": [f"Choose one of: {', '.join(names)}."]}, "policies": names},
        )
    return name


def validate_tick(seconds: Any) -> int:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int)
        or not 1 <= seconds <= MAX_TICK_SECONDS
    ):
        message = f"tick_seconds must be a whole number from 1 to {MAX_TICK_SECONDS}."
        raise ApplicationError(message, {"fields": {"tick_seconds": [message]}})
    return seconds


def settings_get(*, using: str = "default") -> SchedulerSettings:
    row, _ = SchedulerSettings.objects.using(using).get_or_create(pk=SETTINGS_PK)
    return row


def _sync_tick(seconds: int, *, using: str = "default") -> PeriodicTask:
    interval, _ = IntervalSchedule.objects.using(using).get_or_create(
        every=seconds, period=IntervalSchedule.SECONDS
    )
    task = PeriodicTask.objects.using(using).filter(name=TICK_TASK_NAME).first()
    if task is None:
        task = PeriodicTask(name=TICK_TASK_NAME, task=CYCLE_TASK)
    task.task = CYCLE_TASK
    task.interval = interval
    task.queue = CONTROL_QUEUE
    task.enabled = True
    # A tick older than the interval is useless: the next one comes soon anyway.
    task.expire_seconds = seconds
    task.save(using=using)
    return task


def ensure_defaults(*, using: str = "default") -> None:
    """Create the settings row and the tick task when missing (idempotent)."""
    row, _ = SchedulerSettings.objects.using(using).get_or_create(
        pk=SETTINGS_PK,
        defaults={"policy": DEFAULT_POLICY, "tick_seconds": DEFAULT_TICK_SECONDS},
    )
    if not PeriodicTask.objects.using(using).filter(name=TICK_TASK_NAME).exists():
        _sync_tick(row.tick_seconds, using=using)


def settings_update(
    *,
    user: Any,
    policy: str | None = None,
    params: dict[str, Any] | None = None,
    merge_params: bool = False,
    tick_seconds: int | None = None,
) -> SchedulerSettings:
    """Change the settings; the next cycle uses them. `params` replaces the parameters,
    or with `merge_params` updates only the keys given (null removes one)."""
    with transaction.atomic():
        row = SchedulerSettings.objects.select_for_update().filter(pk=SETTINGS_PK).first()
        if row is None:
            row = settings_get()
        if policy is not None:
            row.policy = validate_policy(policy)
        if params is not None:
            if merge_params:
                validate_params(params)
                merged = {**(row.params or {}), **params}
                row.params = {k: v for k, v in merged.items() if v is not None}
            else:
                row.params = validate_params(params)
        if tick_seconds is not None:
            row.tick_seconds = validate_tick(tick_seconds)
        row.updated_by = user.get_username() if user is not None else ""
        row.save()
        _sync_tick(row.tick_seconds)
    return row
