"""A small harness around Executor + Supervisor for tests with real processes.

Waiting is a deadline loop that polls the supervisor, never a fixed sleep."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil

from workers.executor import Executor, JobSpec, Supervisor
from workers.executor.accounts import JobAccounts

DEADLINE_S = 10.0
CREATED: list[Agent] = []  # so a failed test's jobs can be killed (see conftest.py)


class Agent:
    def __init__(
        self,
        tmp_path: Path,
        *,
        gpu_backend: Any = None,
        clock: Any = time.time,
        accounts: JobAccounts | None = None,
        **executor: Any,
    ) -> None:
        self.tmp_path = tmp_path
        self.events: list[dict[str, Any]] = []
        # Tests that are not about isolation run jobs as the test's own account.
        self.executor = Executor(
            tmp_path / "state",
            gpu_backend=gpu_backend,
            clock=clock,
            accounts=accounts or JobAccounts.own(),
            **executor,
        )
        self.supervisor = Supervisor(self.executor, self.events.append, clock=clock)
        CREATED.append(self)

    def kill_all(self) -> None:
        for handle in list(self.executor.handles.values()):
            try:
                os.killpg(handle.pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def spec(self, command: str, job_id: Any = 1, attempt: int = 1, **kw: Any) -> JobSpec:
        kw.setdefault("log_path", str(self.tmp_path / f"logs/{job_id}.{attempt}.log"))
        kw.setdefault("grace", 0.5)
        return JobSpec(job_id=job_id, attempt=attempt, command=command, **kw)

    def start(self, command: str, **kw: Any) -> tuple[JobSpec, int]:
        spec = self.spec(command, **kw)
        return spec, self.supervisor.start(spec)

    def final(self, job_id: Any = 1, attempt: int = 1) -> dict[str, Any] | None:
        for event in self.events:
            if (event["job_id"], event["attempt"]) == (job_id, attempt) and event[
                "state"
            ] != "running":
                return event
        return None

    def wait_final(self, job_id: Any = 1, attempt: int = 1) -> dict[str, Any]:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            self.supervisor.poll()
            event = self.final(job_id, attempt)
            if event is not None:
                return event
            time.sleep(0.02)
        raise AssertionError(f"job {job_id}.{attempt} did not end; events: {self.events}")


def wait_for(predicate: Any, what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def log_text(spec: JobSpec) -> str:
    return Path(spec.log_path).read_text() if Path(spec.log_path).exists() else ""


def group_members(pgid: int) -> list[int]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def wait_members(pgid: int, count: int) -> list[int]:
    """The group's live processes, once there are at least `count` of them."""

    def enough() -> list[int] | None:
        members = group_members(pgid)
        return members if len(members) >= count else None

    return wait_for(enough, f"{count} processes in group {pgid}")


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
