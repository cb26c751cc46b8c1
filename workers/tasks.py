"""The agent's Celery tasks (queue node.<name>): short messages that act on the runtime.

Names and keyword arguments are fixed by the control side (fleet.services.messaging,
fleet.services.dispatch, fleet.services.agents). `start_job` returns as soon as the job's
process is up; the supervisor reports running and the exit (DESIGN.md rule 4). Both start
and stop are acknowledged late and idempotent.
"""

from __future__ import annotations

import logging
from typing import Any

from workers.celery_app import app
from workers.runtime import Agent

logger = logging.getLogger(__name__)

_agent: Agent | None = None


def bind(agent: Agent | None) -> None:
    """Make `agent` the runtime the tasks act on (workers.agent does it at start)."""
    global _agent
    _agent = agent


def _runtime() -> Agent:
    if _agent is None:
        raise RuntimeError(
            "no agent runtime is bound; start the agent with python -m workers.agent"
        )
    return _agent


@app.task(name="workers.tasks.start_job", acks_late=True)
def start_job(*, job_id: Any, attempt: int, spec: dict[str, Any], **_: Any) -> int | None:
    return _runtime().start_job(job_id, attempt, spec)


@app.task(name="workers.tasks.stop_job", acks_late=True)
def stop_job(*, job_id: Any, attempt: int, reason: str = "", **_: Any) -> bool:
    return _runtime().stop_job(job_id, attempt, reason)


@app.task(name="workers.tasks.reconcile", acks_late=True)
def reconcile(*, stop: list[list[Any]], reason: str = "", **_: Any) -> list[Any]:
    return [list(key) for key in _runtime().reconcile(stop, reason)]
