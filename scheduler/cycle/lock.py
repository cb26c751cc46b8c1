"""One scheduling cycle at a time (docs/design.md, rule 5).

On PostgreSQL, a session advisory lock: the database releases it if the worker dies, so it
never needs an expiry. Elsewhere, a Redis lock with an owner token (only its holder can
release it) and an expiry longer than a cycle may run (the task's hard time limit), so a
killed worker cannot block scheduling for long. Either way the lock is only tried, never
waited for: a cycle that finds it held does nothing, since the holder is already
scheduling.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import connections

log = logging.getLogger(__name__)

# The key for pg_try_advisory_lock: "fleetcyc" in ASCII, a positive 64-bit integer.
ADVISORY_KEY = 0x666C_6565_7463_7963
REDIS_KEY = "fleet:scheduler:cycle-lock"


def _expiry() -> int:
    return int(getattr(settings, "CELERY_TASK_TIME_LIMIT", 120)) + 30


@contextmanager
def _advisory(using: str) -> Iterator[bool]:
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_KEY])
        acquired = bool(cursor.fetchone()[0])
    try:
        yield acquired
    finally:
        if acquired:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_KEY])


def redis_client() -> object:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, **getattr(settings, "REDIS_SSL_OPTIONS", {}))


@contextmanager
def _redis(name: str) -> Iterator[bool]:
    from redis.exceptions import LockError

    lock = redis_client().lock(name, timeout=_expiry(), blocking=False)  # type: ignore[attr-defined]
    acquired = bool(lock.acquire(blocking=False))
    try:
        yield acquired
    finally:
        if acquired:
            try:
                lock.release()
            except LockError:  # expired and perhaps taken by another cycle: not ours now
                log.warning("the scheduler lock expired before the cycle ended")


def uses_advisory_lock(using: str = "default") -> bool:
    return connections[using].vendor == "postgresql"


@contextmanager
def cycle_lock(using: str = "default", name: str = REDIS_KEY) -> Iterator[bool]:
    """Yield True when this process holds the scheduler lock for the block, else False."""
    manager = _advisory(using) if uses_advisory_lock(using) else _redis(name)
    with manager as acquired:
        yield acquired
