"""Control-side Celery tasks for agents (queue "control"): thin wrappers over services.

Agents send these by name (workers/runtime.py), each as an envelope signed with the node's
key (workers/wire.py); `agent_task` opens it and hands the node and the signed arguments to
the handler. A message that is unsigned, wrongly signed, expired, replayed or meant for
another task is refused and logged. Reports are acknowledged late (a worker that dies
mid-task leaves the message for another) and are idempotent, so a redelivery changes
nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import OperationalError
from django.utils import timezone

from fleet.api.ready import reaper_ran
from fleet.celery import app
from fleet.models import Node
from fleet.services import (
    agents,
    idle,
    job_reports,
    notifications,
    reaper,
    telemetry,
    telemetry_logs,
    wire,
)

# A database that is unavailable for minutes (a restart, a failover) or locked (SQLite
# under several writers) must not lose a report: the message is retried with backoff for
# about 8 minutes, and applying it twice is harmless. Past that, the agent still repeats
# every outcome with its heartbeats until it is acknowledged (workers/outcomes.py).
AGENT_MESSAGE: dict[str, Any] = {
    "acks_late": True,
    "time_limit": 60,
    "soft_time_limit": 50,
    "autoretry_for": (OperationalError,),
    "retry_backoff": 1,
    "retry_backoff_max": 60,
    "max_retries": 12,
}

Handler = Callable[[Node, dict[str, Any]], Any]


def agent_task(name: str, **options: Any) -> Callable[[Handler], Any]:
    """Register `handler(node, args)` as the task `name`, run only for messages signed by
    the node they name."""

    def register(handler: Handler) -> Any:
        def task(*, m: Any = None, s: Any = None, **_: Any) -> Any:
            opened = wire.agent_message_open(task=name, body=m, signature=s)
            if opened is None:
                return None
            node, message = opened
            result = handler(node, message.args)
            wire.agent_message_done(message)
            return result

        task.__doc__ = handler.__doc__
        return app.task(name=name, **options)(task)

    return register


def _alive(a: dict[str, Any]) -> dict[str, Any]:
    """What registrations and heartbeats share: running attempts, unacknowledged outcomes,
    the agent's clock reading and its lease."""
    at, lease = a.get("at"), a.get("lease")
    return {
        "running": [list(row) for row in a.get("running") or []],
        "outcomes": [o for o in a.get("outcomes") or [] if isinstance(o, dict)],
        "at": float(at) if at is not None else None,
        "lease": float(lease) if lease is not None else None,
    }


@agent_task("fleet.tasks.agent_register", **AGENT_MESSAGE)
def agent_register(node: Node, a: dict[str, Any]) -> None:
    agents.agent_register(
        node=node,
        backend=str(a.get("backend") or ""),
        agent_version=str(a.get("agent_version") or ""),
        gpus=list(a.get("gpus") or []),
        host=a.get("host"),
        **_alive(a),
    )


@agent_task("fleet.tasks.agent_heartbeat", **AGENT_MESSAGE)
def agent_heartbeat(node: Node, a: dict[str, Any]) -> None:
    agents.agent_heartbeat(node=node, **_alive(a))


@agent_task("fleet.tasks.job_report", **AGENT_MESSAGE)
def job_report(node: Node, a: dict[str, Any]) -> None:
    job_reports.job_report_apply(
        node=node,
        job_id=int(a["job_id"]),
        attempt=int(a["attempt"]),
        state=str(a["state"]),
        pid=a.get("pid"),
        exit_code=a.get("exit_code"),
        reason=str(a.get("reason") or ""),
        resumed=a.get("resumed"),
    )


@agent_task("fleet.tasks.job_log", **AGENT_MESSAGE)
def job_log(node: Node, a: dict[str, Any]) -> None:
    telemetry_logs.log_chunk_store(
        node=node,
        job_id=int(a["job_id"]),
        attempt=int(a["attempt"]),
        offset=int(a["offset"]),
        rank=int(a.get("rank") or 0),
        data_b64=str(a["data"]),
        eof=bool(a.get("eof", False)),
    )


# Not acks_late: a tick lost with a dying worker is replaced by the next one.
@agent_task("fleet.tasks.telemetry", time_limit=60, soft_time_limit=50)
def telemetry_ingest(node: Node, a: dict[str, Any]) -> None:
    payload = a.get("payload")
    telemetry.telemetry_ingest(node=node, payload=payload if isinstance(payload, dict) else {})


@app.task(name="fleet.tasks.reap_nodes", time_limit=60, soft_time_limit=50)
def reap_nodes() -> dict[str, int]:
    summary = reaper.nodes_reap()
    reaper_ran()  # beat is ticking (/readyz)
    return summary


@app.task(name="fleet.tasks.telemetry_rollup", time_limit=300, soft_time_limit=280)
def telemetry_rollup() -> dict[str, int]:
    """The periodic housekeeping of history: telemetry rollups and retention, and the
    retention of stored job output."""
    result = telemetry.telemetry_rollup()
    result["log_chunks_pruned"] = telemetry_logs.log_prune()
    return result


# Notifications: one task per message, retried with exponential backoff (10 s, 20 s, ... 160
# s) and then recorded as failed; the HTTP timeout is short, so a dead endpoint holds a worker
# for seconds, never the state machine.
@app.task(
    name="fleet.tasks.notification_deliver",
    bind=True,
    acks_late=True,
    time_limit=60,
    soft_time_limit=50,
    max_retries=notifications.MAX_TRIES - 1,
)
def notification_deliver(self: Any, *, notification_id: int) -> str | None:
    final = self.request.retries >= self.max_retries
    try:
        return notifications.notification_send(notification_id=notification_id, final=final)
    except notifications.DeliveryFailed as e:
        raise self.retry(exc=e, countdown=10 * 2**self.request.retries) from e


@app.task(name="fleet.tasks.notify_tick", time_limit=120, soft_time_limit=100)
def notify_tick() -> dict[str, int]:
    """Every minute: idle GPUs, jobs near their time limit, notifications whose message was
    lost."""
    now = timezone.now()
    result = idle.idle_check(now=now)
    result["time_limit_notified"] = notifications.notify_time_limits(now=now)
    result["resent"] = notifications.notifications_resend(now=now)
    return result


@agent_task("fleet.tasks.gpu_health", **AGENT_MESSAGE)
def gpu_health(node: Node, a: dict[str, Any]) -> None:
    """The GPUs' health findings (Xid, uncorrectable ECC, lost GPU): a new one drains the
    node with the reason (fleet/services/gpu_health.py)."""
    from fleet.services.gpu_health import gpu_findings_apply

    gpu_findings_apply(node=node, findings=a.get("findings"))
