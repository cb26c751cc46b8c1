"""Watching running attempts and reporting every change of state.

The agent makes one `Supervisor`, starts jobs through it and runs `run_forever()` in a
thread (tests call `poll()` directly, with an injected clock). Each change is passed to
`report(event)` as a dict:

    {"job_id", "attempt", "state", "pid", "exit_code", "reason", "at"}

with `state` one of running, succeeded, failed, timeout, cancelled, preempted, lost (its
shim stopped it when the agent's lease ran out, workers.lease). An attempt
that is being stopped (time limit, cancel, preemption, GPU memory over-use) gets the
executor's `stop_signal` (SIGTERM unless FLEET_CHECKPOINT_SIGNAL names another, so the job
can checkpoint) on its whole process group, `grace` seconds, then SIGKILL on the group.
Every event of an attempt with a checkpoint directory also carries `resumed` (whether the
directory held anything when the attempt started, workers.executor.checkpoints). The final event
says why it was stopped, whatever its exit code. `report` is called with the lock held and
should be quick (enqueue a message); if it raises, the event is offered again on the next
poll, so an ended attempt is never forgotten unreported.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from workers.executor.attempts import LOST
from workers.executor.attribution import pid_to_job
from workers.executor.launcher import Executor
from workers.executor.spec import JobKey, JobSpec

logger = logging.getLogger(__name__)

DEFAULT_MEMORY_MARGIN = 0.10


@dataclass
class _Stop:
    state: str
    reason: str
    kill_at: float
    killed: bool = False


def _describe_exit(code: int | str) -> tuple[str, int | None, str]:
    if code == LOST:
        return "failed", None, "exit status unknown: the job's launcher vanished"
    assert isinstance(code, int)
    if code == 0:
        return "succeeded", 0, ""
    if code > 0:
        return "failed", code, f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return "failed", None, f"killed by signal {name}"


class Supervisor:
    """Starts, watches, stops and reports job attempts; see the module docstring."""

    def __init__(
        self,
        executor: Executor,
        report: Callable[[dict[str, Any]], None],
        *,
        clock: Callable[[], float] | None = None,
        gpu_backend: Any = None,
        memory_margin: float = DEFAULT_MEMORY_MARGIN,
    ) -> None:
        self.executor = executor
        self.report = report
        # Time limits count from the executor's start times, so both read the same clock.
        self.clock = clock or executor.clock
        self.gpu_backend = gpu_backend if gpu_backend is not None else executor.gpu_backend
        self.memory_margin = memory_margin
        self._stops: dict[JobKey, _Stop] = {}
        self._final: dict[JobKey, dict[str, Any]] = {}
        self._lock = threading.RLock()

    def _event(self, spec: JobSpec, state: str, **fields: Any) -> dict[str, Any]:
        event = {"job_id": spec.job_id, "attempt": spec.attempt, "state": state, "pid": None}
        event.update({"exit_code": None, "reason": "", "at": self.clock()})
        handle = self.executor.handles.get(spec.key)
        if handle is not None and handle.resumed is not None:
            event["resumed"] = handle.resumed
        event.update(fields)
        return event

    # -- commands ---------------------------------------------------------------------------

    def start(self, spec: JobSpec) -> int:
        """Start the attempt (see `Executor.start`), report it running, return its pid."""
        with self._lock:
            known = spec.key in self.executor.handles
            pid = self.executor.start(spec)
            if not known:
                self._emit(self._event(spec, "running", pid=pid))
            return pid

    def cancel(self, job_id: Any, attempt: int, grace: float | None = None) -> bool:
        """Stop the attempt; it ends as cancelled. False if it is not running here."""
        return self._begin_stop((job_id, attempt), "cancelled", "cancelled", grace)

    def preempt(self, job_id: Any, attempt: int, grace: float | None = None) -> bool:
        """Stop the attempt to make room for other work; it ends as preempted. The job
        gets the stop signal (SIGTERM by default) and `grace` seconds (default: its own, which it sees as
        FLEET_PREEMPT_GRACE) to checkpoint. False if it is not running here."""
        return self._begin_stop((job_id, attempt), "preempted", "preempted", grace)

    def running(self) -> list[tuple[Any, int, int]]:
        """(job_id, attempt, pid) of every attempt still running here, including those a
        previous agent process started: what the agent reports when it reconciles."""
        with self._lock:
            return [
                (key[0], key[1], handle.pid)
                for key, handle in self.executor.handles.items()
                if self.executor.exit_status(key) is None
            ]

    def stop_unknown(self, keep: Iterable[JobKey]) -> list[JobKey]:
        """Stop every running attempt not in `keep` (the attempts the control side still
        assigns to this node); they end as cancelled. Returns the attempts stopped."""
        keep = set(keep)
        stopped = []
        with self._lock:
            for job_id, attempt, _pid in self.running():
                key = (job_id, attempt)
                if key not in keep and self._begin_stop(
                    key, "cancelled", "this node is no longer assigned the attempt", None
                ):
                    stopped.append(key)
        return stopped

    def pid_to_job(self, pids: Iterable[int]) -> dict[int, Any]:
        """Owning job id of each pid (see `workers.executor.attribution.pid_to_job`)."""
        with self._lock:
            roots: dict[int, Any] = {}
            for handle in self.executor.handles.values():
                roots[handle.pid] = handle.spec.job_id
                roots[handle.shim_pid] = handle.spec.job_id
        return pid_to_job(pids, roots)

    def _begin_stop(self, key: JobKey, state: str, reason: str, grace: float | None) -> bool:
        with self._lock:
            handle = self.executor.handles.get(key)
            if handle is None or key in self._final:
                return False
            if key in self._stops:
                # Already stopping: a shorter grace may only bring the kill forward.
                if grace is not None:
                    stop = self._stops[key]
                    stop.kill_at = min(stop.kill_at, self.clock() + grace)
                return True
            if self.executor.exit_status(key) is not None:
                return False
            wait = handle.spec.grace if grace is None else grace
            self._stops[key] = _Stop(state, reason, self.clock() + wait)
            self.executor.signal_group(key, self.executor.stop_signal)
            return True

    # -- watching ---------------------------------------------------------------------------

    def poll(self) -> None:
        """One round: report ended attempts, enforce time limits and grace periods, and
        check fractional jobs' GPU memory."""
        with self._lock:
            now = self.clock()
            for key, handle in list(self.executor.handles.items()):
                if key in self._final:
                    self._emit(self._final[key])
                    continue
                code = self.executor.exit_status(key)
                if code is not None:
                    self._finish(key, handle.spec, handle.pid, code)
                    continue
                stop = self._stops.get(key)
                if stop is not None:
                    if not stop.killed and now >= stop.kill_at:
                        self.executor.signal_group(key, signal.SIGKILL)
                        stop.killed = True
                    continue
                limit = handle.spec.time_limit
                if limit and now >= handle.started_at + limit:
                    self._begin_stop(
                        key, "timeout", f"exceeded its time limit of {limit:g} s", None
                    )
            if self.gpu_backend is not None and self._fractional_running():
                self.enforce_gpu_memory(self.gpu_backend.sample())

    def run_forever(self, interval: float = 1.0, stop: threading.Event | None = None) -> None:
        """Poll every `interval` seconds until `stop` is set. A failing poll is logged and
        retried, so one bad reading never stops supervision."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                self.poll()
            except Exception:
                logger.exception("supervisor poll failed")
            stop.wait(interval)

    def _finish(self, key: JobKey, spec: JobSpec, pid: int, code: int | str) -> None:
        state, exit_code, reason = _describe_exit(code)
        if state == "failed" and self.executor.memory_killed(key):
            reason = (
                f"{reason}: it went past its memory limit of {spec.memory_mb} MB and the "
                "kernel killed it"
            )
        stop = self._stops.pop(key, None)
        if stop is not None:
            state, reason = stop.state, stop.reason
        if self.executor.stop_cause(key) == "lease":
            state = "lost"
            reason = "stopped on its node: the node's lease ran out (no word from the control side)"
        self._final[key] = self._event(spec, state, pid=pid, exit_code=exit_code, reason=reason)
        self._emit(self._final[key])

    def _emit(self, event: dict[str, Any]) -> None:
        try:
            self.report(event)
        except Exception:
            logger.exception("reporting %s failed; will retry", event)
            return
        if event["state"] != "running":
            key = (event["job_id"], event["attempt"])
            self._final.pop(key, None)
            self.executor.forget(key)

    # -- fractional GPU memory --------------------------------------------------------------

    def _fractional_running(self) -> bool:
        return any(
            h.spec.gpu_memory_mb is not None and key not in self._stops
            for key, h in self.executor.handles.items()
        )

    def enforce_gpu_memory(self, samples: Sequence[Any]) -> list[JobKey]:
        """Stop fractional jobs whose processes hold more GPU memory than they asked for,
        plus the margin. `samples` are `GpuSample`s (a caller that already sampled for
        telemetry passes them here instead of sampling twice). Returns the attempts
        stopped; each ends as failed with the measured and requested memory as reason."""
        with self._lock:
            used: dict[int, int] = {}
            procs = [p for sample in samples for p in sample.processes]
            owners = self.pid_to_job(p.pid for p in procs)
            for proc in procs:
                if proc.pid in owners and proc.used_memory_mb is not None:
                    job_id = owners[proc.pid]
                    used[job_id] = used.get(job_id, 0) + proc.used_memory_mb
            stopped = []
            for key, handle in list(self.executor.handles.items()):
                request = handle.spec.gpu_memory_mb
                if request is None or key in self._stops:
                    continue
                measured = used.get(handle.spec.job_id, 0)
                if measured > request * (1 + self.memory_margin):
                    reason = (
                        f"used {measured:,} MB of GPU memory; its request is {request:,} MB "
                        f"(+{self.memory_margin * 100:g}%)"
                    )
                    if self._begin_stop(key, "failed", reason, None):
                        stopped.append(key)
            return stopped
