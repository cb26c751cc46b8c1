"""Raising a job's fence when one of its attempts is over (workers/fence.py explains why).

Called after commit by the state machine whenever an attempt leaves assigned or running.
A fence that cannot be written (broker down) is logged: the start's own expiry still
bounds how late a queued start can run, and reconciliation stops it if it does.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

from django.conf import settings
from django.db import transaction

from workers.fence import broker_client, dispatch_token, fence_raise

log = logging.getLogger(__name__)


@cache
def _client() -> Any:
    return broker_client(settings.CELERY_BROKER_URL)


def fence_on_commit(*, job_id: int, attempt: int, assigned_at: Any) -> None:
    """After commit, fence the dispatch of `attempt` made at `assigned_at` (None: the
    attempt was never dispatched, nothing to fence)."""
    if assigned_at is None:
        return
    dispatch = dispatch_token(assigned_at.timestamp())

    def write() -> None:
        try:
            fence_raise(_client(), job_id, attempt, dispatch)
        except Exception:
            log.warning("could not fence attempt %s of job %s", attempt, job_id)

    transaction.on_commit(write)
