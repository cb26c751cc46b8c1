"""The agent's runtime: what its Celery tasks and its background loop act on.

One `Agent` per host process. It owns the executor and supervisor (workers/executor/),
the GPU backend and the log shipper, and talks to the control side only through `send`
(`send(task_name, **kwargs)`, which signs the message with the node key). Every report
carries (job_id, attempt). Final reports are also kept on disk until the control side
acknowledges them (workers.outcomes), and the same acknowledgement renews the agent's
lease (workers.lease). Nothing here imports Django; tests drive it with a recording `send`
and call the tick methods directly.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.executor import Executor, ExecutorError, JobKey, LeaseExpired, Supervisor
from workers.executor.accounts import JobAccounts
from workers.executor.attempts import private_dir
from workers.executor.cgroups import Enforcement
from workers.executor.checkpoints import DEFAULT_RETENTION_S, CheckpointStore
from workers.executor.spec import spec_from_start
from workers.host import HostShape
from workers.lease import DEFAULT_LEASE_S, Lease
from workers.logship import DEFAULT_MAX_BYTES, LogShipper
from workers.outcomes import OutcomeStore
from workers.started import StartedAttempts
from workers.telemetry import telemetry_payload

logger = logging.getLogger(__name__)

REGISTER_TASK = "fleet.tasks.agent_register"
HEARTBEAT_TASK = "fleet.tasks.agent_heartbeat"
REPORT_TASK = "fleet.tasks.job_report"
TELEMETRY_TASK = "fleet.tasks.telemetry"
LOG_TASK = "fleet.tasks.job_log"
HEALTH_TASK = "fleet.tasks.gpu_health"


@dataclass(frozen=True)
class AgentConfig:
    node: str
    state_dir: Path
    heartbeat_interval: float = 5.0
    register_interval: float = 60.0
    telemetry_interval: float = 5.0
    log_interval: float = 2.0
    supervise_interval: float = 1.0
    job_grace: float = 30.0
    log_max_bytes: int = DEFAULT_MAX_BYTES
    version: str = "dev"
    # Who jobs run as and what they inherit (workers.executor.accounts, .spec).
    job_accounts: JobAccounts = field(default_factory=JobAccounts)
    job_env_allow: tuple[str, ...] = ()
    scratch_dir: Path | None = None  # default: `scratch` beside state_dir
    lease_seconds: float = DEFAULT_LEASE_S
    # What the host offers jobs (workers.host; None: registrations carry no `host`) and how
    # jobs are held to what they ask (workers.executor.cgroups).
    host: HostShape | None = None
    enforcement: Enforcement = field(
        default_factory=lambda: Enforcement(note="none: the agent was not asked to confine jobs")
    )
    # Where jobs keep checkpoints across attempts (workers.executor.checkpoints): None is
    # `checkpoints` beside state_dir; kept `checkpoint_retention_s` after last use (0:
    # forever); a stopped job gets `checkpoint_signal` first, then its grace, then SIGKILL.
    checkpoint_root: Path | None = None
    checkpoint_retention_s: float = DEFAULT_RETENTION_S
    checkpoint_signal: signal.Signals = signal.SIGTERM
    checkpoint_sweep_interval: float = 3600.0


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        backend: Any,
        send: Callable[..., Any],
        clock: Callable[[], float] = time.time,
        fence: Callable[[Any, int, str], bool] | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.send = send
        self.clock = clock
        # Whether the control side has ended a dispatch since (workers.fence), asked with
        # (job_id, attempt, dispatch) when its start arrives; None: no fences to check.
        self.fence = fence
        state = config.state_dir
        # Attempt records, launch files, job logs and the agent's bookkeeping are the
        # agent's alone: a job (another account) cannot read them.
        private_dir(state)
        private_dir(state / "logs")
        self.lease = Lease(state / "lease", config.lease_seconds, clock=clock)
        self.outcomes = OutcomeStore(state / "outcomes")
        # Beside state_dir, not in it: jobs (other accounts) must reach their directories.
        self.checkpoints = CheckpointStore(
            config.checkpoint_root or state.parent / "checkpoints",
            retention_s=config.checkpoint_retention_s,
            clock=clock,
        )
        self.executor = Executor(
            state / "attempts",
            lease_path=self.lease.path,
            env_allow=config.job_env_allow,
            accounts=config.job_accounts,
            scratch_dir=config.scratch_dir or state.parent / "scratch",
            gpu_backend=backend,
            enforcement=config.enforcement,
            checkpoints=self.checkpoints,
            stop_signal=config.checkpoint_signal,
            clock=clock,
        )
        accounts = config.job_accounts
        if accounts.switching:
            logger.info("jobs run as %s unless FLEET_JOB_USER_MAP maps them", accounts.default)
            try:
                accounts.resolve(user=None, team=None)
            except ExecutorError as exc:
                logger.error("jobs that no mapping covers will fail: %s", exc)
        else:
            logger.warning(
                "jobs run as the agent's own account (uid %d) and are not isolated from it: "
                "%s (a development set-up)",
                os.geteuid(),
                "the agent does not run as root, so it cannot switch accounts"
                if os.geteuid() != 0
                else "account switching is off",
            )
        self.supervisor = Supervisor(self.executor, report=self._report)
        # GPU memory of fractional jobs is checked on the telemetry tick, with the samples
        # sent as telemetry, rather than sampling the GPUs again on every poll.
        self.supervisor.gpu_backend = None
        self.logs = LogShipper(
            lambda **kw: self.send(LOG_TASK, **kw),
            state / "logship.json",
            max_bytes=config.log_max_bytes,
        )
        self.started = StartedAttempts(state / "started")
        self._lock = threading.RLock()
        for key, handle in self.executor.handles.items():
            self.logs.watch(key, handle.spec.log_path, rank=handle.spec.rank)

    # -- commands from the control side -----------------------------------------------------

    def start_job(self, job_id: Any, attempt: int, spec: dict[str, Any]) -> int | None:
        """Start the attempt and return its pid, or None when it is not started (already
        ran here; or could not start: reported failed, or lost when the lease is out)."""
        key = (job_id, int(attempt))
        with self._lock:
            if key in self.executor.handles:
                return self.executor.handles[key].pid
            if self._fenced(job_id, int(attempt), spec.get("dispatch")):
                logger.info("attempt %s.%s not started: the control side has ended it since", *key)
                return None
            if not self.started.mark(key, spec.get("dispatch")):
                logger.info("attempt %s.%s was started here before; not again", *key)
                return None
            if self.lease.expired():
                # Taken after the lease ran out (the agent was frozen or cut off): the
                # control side may run the attempt's successor elsewhere by now. Marked
                # started above, so a redelivery never runs it here either; the shim makes
                # the same check for a lease that runs out between here and its start.
                self._refuse(
                    job_id,
                    int(attempt),
                    f"job {job_id} was not started: the node's lease had run out before the "
                    "start was taken (no word from the control side), which may run the job "
                    "elsewhere by now",
                    state="lost",
                )
                return None
            # One file per dispatch: a reused job id and attempt never appends to old output.
            dispatch = spec.get("dispatch")
            log_name = f"{job_id}.{attempt}" + (f"-{dispatch}" if dispatch else "") + ".log"
            try:
                job = spec_from_start(
                    job_id,
                    int(attempt),
                    spec,
                    log_path=str(self.config.state_dir / "logs" / log_name),
                    default_grace=self.config.job_grace,
                )
            except ExecutorError as exc:
                # Refused whole: nothing of it is started, watched or kept.
                self._refuse(job_id, int(attempt), f"refused a malformed start: {exc}")
                return None
            try:
                pid = self.supervisor.start(job)
            except LeaseExpired as exc:
                # Not a failure of the job: the control side requeues it (or has already).
                self._refuse(job_id, int(attempt), str(exc), state="lost")
                return None
            except ExecutorError as exc:
                self._refuse(job_id, int(attempt), str(exc))
                return None
            self.logs.watch(key, job.log_path, fresh=True, rank=job.rank)
            return pid

    def _refuse(self, job_id: Any, attempt: int, reason: str, state: str = "failed") -> None:
        """The attempt cannot start here: say why in the log and report it `state`."""
        logger.warning("job %s attempt %s: %s", job_id, attempt, reason)
        self._report(
            {"job_id": job_id, "attempt": attempt, "state": state, "pid": None,
             "exit_code": None, "reason": reason, "at": self.clock()}
        )  # fmt: skip

    def stop_job(self, job_id: Any, attempt: int, reason: str = "") -> bool:
        stopping = self.supervisor.cancel(job_id, int(attempt))
        logger.info("stop %s.%s (%s): %s", job_id, attempt, reason, stopping)
        return stopping

    def reconcile(self, stop: Iterable[Any], reason: str = "") -> list[JobKey]:
        """Stop the attempts the control side no longer assigns to this node."""
        return [
            (job_id, int(attempt))
            for job_id, attempt in stop
            if self.stop_job(job_id, attempt, reason or "not assigned to this node")
        ]

    # -- reports ----------------------------------------------------------------------------

    def _send_report(self, event: dict[str, Any]) -> None:
        # `resumed`: whether the attempt's checkpoint directory held anything at its start.
        extra = {"resumed": event["resumed"]} if event.get("resumed") is not None else {}
        self.send(
            REPORT_TASK,
            job_id=event["job_id"],
            attempt=event["attempt"],
            state=event["state"],
            pid=event.get("pid"),
            exit_code=event.get("exit_code"),
            reason=event.get("reason", ""),
            at=event.get("at"),
            **extra,
        )

    def _fenced(self, job_id: Any, attempt: int, dispatch: Any) -> bool:
        if self.fence is None or not dispatch:
            return False
        try:
            return self.fence(job_id, attempt, str(dispatch))
        except Exception:  # the broker is unreachable: the start's own expiry still holds
            logger.warning("could not read the fence of job %s", job_id)
            return False

    def _report(self, event: dict[str, Any]) -> None:
        if event["state"] != "running":
            # Kept until acknowledged: repeated with every heartbeat (workers.outcomes).
            self.outcomes.keep(event)
            # The rest of the output goes first, so a finished job's log is complete by the
            # time the control side learns that it finished.
            self.logs.finish((event["job_id"], event["attempt"]))
        self._send_report(event)

    def running(self) -> list[list[Any]]:
        """[job_id, attempt, pid, gpu_indices] of each attempt still running here."""
        handles = self.executor.handles
        return [
            [job_id, attempt, pid, list(handles[(job_id, attempt)].spec.gpu_indices)]
            for job_id, attempt, pid in self.supervisor.running()
            if (job_id, attempt) in handles
        ]

    def register(self) -> None:
        host = {}
        if self.config.host is not None:
            host["host"] = self.config.host.message(self.config.enforcement.note)
        self.send(
            REGISTER_TASK,
            **host,
            backend=getattr(self.backend, "backend_name", ""),
            agent_version=self.config.version,
            gpus=[g.to_dict() for g in self.backend.inventory()],
            running=self.running(),
            outcomes=self.outcomes.pending(),
            lease=self.config.lease_seconds,
            at=self.clock(),
        )

    def heartbeat(self) -> None:
        # A running job's checkpoint directory is in use, however long the job runs: no
        # agent sharing the root sweeps it meanwhile.
        for team, job_id in self.executor.checkpoints_in_use():
            self.checkpoints.touch(team=team, job_id=job_id)
        self.send(
            HEARTBEAT_TASK,
            running=self.running(),
            outcomes=self.outcomes.pending(),
            lease=self.config.lease_seconds,
            at=self.clock(),
        )

    def checkpoint_sweep(self) -> list[Path]:
        """Remove checkpoint directories unused for the retention (never one of an attempt
        known here)."""
        return self.checkpoints.sweep(keep=self.executor.checkpoints_in_use())

    def acknowledge(self, heard_at: float, outcomes: Iterable[Any] = ()) -> None:
        """The control side has applied the heartbeat or registration sent at `heard_at`
        and the outcomes listed: renew the lease, forget those outcomes."""
        self.lease.renew(float(heard_at))
        self.outcomes.acknowledge((job_id, int(attempt)) for job_id, attempt in outcomes)

    def telemetry_tick(self) -> None:
        self.health_tick()
        samples = self.backend.sample()
        owners = self.supervisor.pid_to_job(p.pid for s in samples for p in s.processes)
        self.send(
            TELEMETRY_TASK,
            payload=telemetry_payload(
                node_name=self.config.node,
                backend_name=getattr(self.backend, "backend_name", ""),
                samples=samples,
                job_by_pid=owners,
            ),
        )
        self.supervisor.enforce_gpu_memory(samples)

    def health_tick(self) -> None:
        """Send the GPUs' health findings (workers.gpu.GpuFinding), if there are any. They
        go every tick while they last: the control side acts on each once, and a message
        lost on the way is made good by the next."""
        health = getattr(self.backend, "health", None)
        if health is None:
            return
        try:
            findings = health()
        except Exception:  # a telemetry tick still goes out
            logger.exception("could not read the GPUs' health")
            return
        if findings:
            self.send(HEALTH_TASK, findings=[f.to_dict() for f in findings], at=self.clock())

    # -- background -------------------------------------------------------------------------

    def run_background(self, stop: threading.Event) -> list[threading.Thread]:
        """Start the supervisor and the periodic duties (heartbeat, telemetry, log
        shipping) in daemon threads until `stop` is set."""
        cfg = self.config
        # Registering again now and then is idempotent and heals a registration the control
        # side could not apply (database down when the agent started).
        duties: list[tuple[float, Callable[[], Any]]] = [
            (cfg.register_interval, self.register),
            (cfg.heartbeat_interval, self.heartbeat),
            (cfg.telemetry_interval, self.telemetry_tick),
            (cfg.log_interval, self.logs.ship),
            (cfg.checkpoint_sweep_interval, self.checkpoint_sweep),
        ]
        threads = [
            threading.Thread(
                target=self.supervisor.run_forever,
                args=(cfg.supervise_interval, stop),
                name="supervisor",
                daemon=True,
            )
        ]
        for interval, duty in duties:
            threads.append(
                threading.Thread(
                    target=_every,
                    args=(interval, duty, stop),
                    name=duty.__name__,
                    daemon=True,
                )
            )
        for t in threads:
            t.start()
        return threads


def _every(interval: float, duty: Callable[[], Any], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            duty()
        except Exception:
            logger.exception("agent duty %s failed", getattr(duty, "__name__", duty))
        stop.wait(interval)
