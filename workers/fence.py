"""Fences: the control side's word that an attempt is over, checked by an agent when a
start arrives (design rule 7; fenced starts).

A start waits in its node's queue until the agent takes it; meanwhile the control side may
cancel the job, requeue it or declare it lost. A stop sent then arrives after the start, too
late. So whenever an attempt leaves assigned or running, the control side fences that dispatch in the broker's Redis
(`fleet:fence:<job id>.<attempt>@<dispatch>`, the dispatch being its time, as in the start),
and the agent looks for the fence when it takes a start: a fenced start never runs. Naming
the dispatch keeps a control side whose database was reset (ids and attempts reused) from
fencing new work with old fences. A client of the broker could raise a fence (refusing a start, which it could do
by deleting the message anyway) but not forge a start. Pure: redis-py only.
"""

from __future__ import annotations

import os
from typing import Any

import redis

from workers.broker import DEFAULT_URL, redis_ssl_options

FENCE_KEY = "fleet:fence:{}.{}@{}"
# Longer than any start is good for (FLEET_START_TIMEOUT, minutes).
FENCE_TTL_S = 6 * 3600


def dispatch_token(assigned_at: float) -> str:
    """How a start names its dispatch (the time it was dispatched)."""
    return f"{assigned_at:.6f}"


def broker_client(url: str | None = None) -> redis.Redis:
    """A client of the broker's Redis (where fences live), with the same TLS options."""
    url = url or os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL") or DEFAULT_URL
    return redis.Redis.from_url(
        url, socket_timeout=2, socket_connect_timeout=2, **redis_ssl_options(url)
    )


def fence_raise(client: Any, job_id: Any, attempt: int, dispatch: str) -> None:
    client.set(FENCE_KEY.format(job_id, int(attempt), dispatch), 1, ex=FENCE_TTL_S)


def fenced(client: Any, job_id: Any, attempt: int, dispatch: str) -> bool:
    return bool(client.exists(FENCE_KEY.format(job_id, int(attempt), dispatch)))
