"""Control-side Celery tasks for agents (queue "control"): thin wrappers over services.

Agents send these by name (workers/agent_runtime.py); each message names its node and
carries the node's key, and a message with a wrong key is refused and logged. Reports are
acknowledged late (a worker that dies mid-task leaves the message for another) and are
idempotent, so a redelivery changes nothing twice.
"""

from __future__ import annotations

from typing import Any

from django.db import OperationalError

from fleet.celery import app
from fleet.services import agents, telemetry, telemetry_logs

# A database that is briefly unavailable or locked (SQLite under several writers) must not
# lose a report: the message is retried with backoff, and applying it twice is harmless.
AGENT_MESSAGE: dict[str, Any] = {
    "acks_late": True,
    "time_limit": 60,
    "soft_time_limit": 50,
    "autoretry_for": (OperationalError,),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "max_retries": 8,
}


@app.task(name="fleet.tasks.agent_register", **AGENT_MESSAGE)
def agent_register(
    *,
    node: str,
    key: str,
    backend: str = "",
    agent_version: str = "",
    gpus: list[dict[str, Any]] | None = None,
    running: list[list[Any]] | None = None,
    **_: Any,
) -> None:
    found = agents.node_authenticate(name=node, key=key)
    if found is not None:
        agents.agent_register(
            node=found,
            backend=backend,
            agent_version=agent_version,
            gpus=gpus or [],
            running=running or [],
        )


@app.task(name="fleet.tasks.agent_heartbeat", **AGENT_MESSAGE)
def agent_heartbeat(
    *, node: str, key: str, running: list[list[Any]] | None = None, **_: Any
) -> None:
    found = agents.node_authenticate(name=node, key=key)
    if found is not None:
        agents.agent_heartbeat(node=found, running=running or [])


@app.task(name="fleet.tasks.job_report", **AGENT_MESSAGE)
def job_report(
    *,
    node: str,
    key: str,
    job_id: int,
    attempt: int,
    state: str,
    pid: int | None = None,
    exit_code: int | None = None,
    reason: str = "",
    **_: Any,
) -> None:
    found = agents.node_authenticate(name=node, key=key)
    if found is not None:
        agents.job_report_apply(
            node=found,
            job_id=int(job_id),
            attempt=int(attempt),
            state=state,
            pid=pid,
            exit_code=exit_code,
            reason=reason or "",
        )


@app.task(name="fleet.tasks.job_log", **AGENT_MESSAGE)
def job_log(
    *,
    node: str,
    key: str,
    job_id: int,
    attempt: int,
    offset: int,
    data: str,
    eof: bool = False,
    **_: Any,
) -> None:
    found = agents.node_authenticate(name=node, key=key)
    if found is not None:
        telemetry_logs.log_chunk_store(
            node=found,
            job_id=int(job_id),
            attempt=int(attempt),
            offset=int(offset),
            data_b64=data,
            eof=bool(eof),
        )


@app.task(name="fleet.tasks.telemetry", time_limit=60, soft_time_limit=50)
def telemetry_ingest(*, node: str, key: str, payload: dict[str, Any], **_: Any) -> None:
    # Not acks_late: a tick lost with a dying worker is replaced by the next one.
    found = agents.node_authenticate(name=node, key=key)
    if found is not None:
        telemetry.telemetry_ingest(node=found, payload=payload)


@app.task(name="fleet.tasks.reap_nodes", time_limit=60, soft_time_limit=50)
def reap_nodes() -> dict[str, int]:
    return agents.nodes_reap()


@app.task(name="fleet.tasks.telemetry_rollup", time_limit=300, soft_time_limit=280)
def telemetry_rollup() -> dict[str, int]:
    """The periodic housekeeping of history: telemetry rollups and retention, and the
    retention of stored job output."""
    result = telemetry.telemetry_rollup()
    result["log_chunks_pruned"] = telemetry_logs.log_prune()
    return result
