"""Running real agents against Redis in tests, and a control side that runs in the test.

`start_agent` launches `python -m workers.agent` as a subprocess (broker only, no Django
settings, no database URL), with short intervals and its own state directory. It sends
everything to a control queue unique to the test; `ControlPump` consumes that queue and
runs each message through the control task functions in the test's own thread, so they use
the test database. Commands to the agent (start, stop, reconcile) go through the broker as
in production.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

REPO = Path(__file__).resolve().parents[2]


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class AgentProcess:
    name: str
    state_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)

    def job_records(self) -> list[dict[str, Any]]:
        records = []
        for path in (self.state_dir / "attempts").glob("*/record.json"):
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return records

    def cleanup(self) -> None:
        self.kill()
        for record in self.job_records():
            for pid, group in ((record["pid"], True), (record["shim_pid"], False)):
                try:
                    os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def start_agent(
    name: str,
    key: str,
    state_dir: Path,
    control_queue: str,
    *,
    simulate: str = "2xA100-80GB",
    env: dict[str, str] | None = None,
) -> AgentProcess:
    child_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO", "DATABASE")) and k not in {"PYTEST_CURRENT_TEST"}
    }
    from fleet.services.wire import control_public_key

    child_env.update(
        REDIS_URL=settings.CELERY_BROKER_URL,
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        FLEET_NODE_KEY=key,
        FLEET_CONTROL_PUBLIC_KEY=control_public_key(),
        FLEET_CONTROL_QUEUE=control_queue,
        FLEET_AGENT_STATE_DIR=str(state_dir),
        FLEET_HEARTBEAT_INTERVAL="0.5",
        FLEET_TELEMETRY_INTERVAL="0.5",
        FLEET_LOG_SHIP_INTERVAL="0.3",
        FLEET_SUPERVISE_INTERVAL="0.1",
        FLEET_JOB_GRACE="2",
        # As root, jobs run as nobody, in scratch directories nobody can reach (tmp_path
        # is private to root); not as root, the agent runs them as the test's account.
        FLEET_JOB_USER="nobody",
        FLEET_JOB_SCRATCH_DIR="/tmp/fleet-test-scratch",
        PYTHONUNBUFFERED="1",
    )
    child_env.update(env or {})
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "agent.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.agent", "--node", name, "--simulate", simulate,
             "--loglevel", "INFO"],
            cwd=REPO,
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return AgentProcess(name=name, state_dir=state_dir, proc=proc, log_path=log_path)


@dataclass
class ControlPump:
    """Runs the agents' messages through fleet.tasks in this thread. `on_commit` is the
    pytest-django `django_capture_on_commit_callbacks` fixture, so messages the control
    side sends after commit (reconcile replies, stops) really go out."""

    queue: str
    on_commit: Callable[..., AbstractContextManager[Any]]
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        from fleet.celery import app

        self._conn = app.connection_for_read()
        self._queue = self._conn.SimpleQueue(self.queue, no_ack=True)

    def close(self) -> None:
        self._queue.close()
        self._conn.close()

    def _run(self, name: str, kwargs: dict[str, Any]) -> None:
        import fleet.tasks  # noqa: F401 - registers the control tasks, as the worker does
        from fleet.celery import app

        self.seen.append((name, kwargs))
        with self.on_commit(execute=True), transaction.atomic():
            app.tasks[name].run(**kwargs)

    def pump(self, until: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
        """Process messages until `until()` is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            result = until()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or until}")
            try:
                message = self._queue.get(timeout=0.2)
            except self._queue.Empty:
                continue
            args, kwargs, _embed = message.payload
            self._run(message.headers["task"], kwargs)

    def listen(self, until: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
        """Record the agents' messages without applying them (the control side does not see
        them) until `until()` is truthy; returns its value. `reports()` reads them."""
        deadline = time.monotonic() + timeout
        while True:
            result = until()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or until}")
            try:
                message = self._queue.get(timeout=0.2)
            except self._queue.Empty:
                continue
            self.seen.append((message.headers["task"], message.payload[1]))

    def opened(self, task: str) -> list[tuple[str, dict[str, Any]]]:
        """(node, args) of each message of `task` seen so far, as its node signed it."""
        bodies = [json.loads(kw["m"]) for name, kw in self.seen if name == task and "m" in kw]
        return [(body["node"], body["args"]) for body in bodies]

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run a control-side action with its after-commit messages sent."""
        with self.on_commit(execute=True), transaction.atomic():
            return fn()


def dispatch(control: ControlPump, job: Any, node: Any, gpus: tuple[int, ...] = (0,)) -> None:
    """Dispatch `job` to `node` through the state machine and send its signed start, as the
    scheduling cycle does."""
    from fleet.services.dispatch import send_start_on_commit
    from fleet.services.job_states import SCHEDULER, job_transition

    def go() -> None:
        dispatched = job_transition(
            job_id=job.pk,
            action="dispatch",
            actor=SCHEDULER,
            fields={"node": node, "gpu_indices": list(gpus)},
        )
        send_start_on_commit(dispatched)

    control.run(go)
