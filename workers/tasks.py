"""The agent's Celery tasks (queue node.<name>): short messages that act on the runtime.

Names and arguments are fixed by the control side (fleet.services.messaging,
fleet.services.dispatch, fleet.services.agents). Every message is a signed envelope
(workers.wire): the agent acts only on messages the control side signed for this node and
this task, that have not expired and that it has not acted on before; anything else is
dropped and logged. `start_job` returns as soon as the job's process is up; the supervisor
reports running and the exit (design rule 4). Start and stop are acknowledged late and
idempotent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from workers.celery_app import app
from workers.runtime import Agent
from workers.wire import Gate, Message, WireError

logger = logging.getLogger(__name__)

_agent: Agent | None = None
_gate: Gate | None = None


def bind(agent: Agent | None, gate: Gate | None = None) -> None:
    """Make `agent` the runtime the tasks act on and `gate` the check every message passes
    (workers.agent does it at start)."""
    global _agent, _gate
    _agent, _gate = agent, gate


def _runtime() -> Agent:
    if _agent is None:
        raise RuntimeError(
            "no agent runtime is bound; start the agent with python -m workers.agent"
        )
    return _agent


def _handle(task: str, m: Any, s: Any, act: Callable[[Agent, dict[str, Any]], Any]) -> Any:
    agent = _runtime()
    if _gate is None:
        logger.warning("refused %s: this agent has no control-side key to check it", task)
        return None
    try:
        message: Message = _gate.open(task, m, s)
    except WireError as exc:
        logger.warning("refused %s: %s", task, exc)
        return None
    try:
        result = act(agent, message.args)
    except (KeyError, TypeError, ValueError) as exc:
        # Signed by the control side yet malformed: a version mismatch. Acting on it again
        # would fail the same way, so it is used up like any other.
        logger.error("dropped %s: malformed arguments (%s)", task, exc)
        result = None
    _gate.done(message)
    return result


@app.task(name="workers.tasks.start_job", acks_late=True)
def start_job(*, m: Any = None, s: Any = None, **_: Any) -> int | None:
    return _handle(
        "workers.tasks.start_job",
        m,
        s,
        lambda agent, a: agent.start_job(a["job_id"], int(a["attempt"]), dict(a["spec"])),
    )


@app.task(name="workers.tasks.stop_job", acks_late=True)
def stop_job(*, m: Any = None, s: Any = None, **_: Any) -> bool | None:
    return _handle(
        "workers.tasks.stop_job",
        m,
        s,
        lambda agent, a: agent.stop_job(a["job_id"], int(a["attempt"]), str(a.get("reason", ""))),
    )


@app.task(name="workers.tasks.reconcile", acks_late=True)
def reconcile(*, m: Any = None, s: Any = None, **_: Any) -> list[Any] | None:
    return _handle(
        "workers.tasks.reconcile",
        m,
        s,
        lambda agent, a: [
            list(key) for key in agent.reconcile(list(a["stop"]), str(a.get("reason", "")))
        ],
    )


@app.task(name="workers.tasks.acknowledge", acks_late=True)
def acknowledge(*, m: Any = None, s: Any = None, **_: Any) -> None:
    """The control side applied a heartbeat or registration: renew the lease from the
    moment it was sent, and forget the outcomes it acknowledges."""
    return _handle(
        "workers.tasks.acknowledge",
        m,
        s,
        lambda agent, a: agent.acknowledge(float(a["heard_at"]), list(a.get("outcomes") or [])),
    )
