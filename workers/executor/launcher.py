"""Starting job processes and keeping track of them across agent restarts.

Each attempt gets a directory under `state_dir` holding `record.json` (who runs, since
when, with what limits) and, once the job has ended, `status.json` written by the shim
(`workers.executor.attempts` reads and writes them). A restarted agent builds an `Executor` on the same
`state_dir` and finds every attempt the previous one started: still running, ended while
the agent was away, or lost.

Jobs are kept apart from the agent: `state_dir` and every attempt directory are 0700, so a
job reads neither its launch file nor another job's record; the job runs as the account
`JobAccounts` picks, with the allow-listed environment (`job_environment`); a job without
a working directory gets a fresh one under `scratch_dir` (0711: a job reaches its own
directory but cannot list the others'), owned by its account, mode 0700, removed when the
attempt is forgotten.

With a `CheckpointStore` every job also gets its checkpoint directory (FLEET_CHECKPOINT_DIR,
workers.executor.checkpoints), made before the start and kept after the attempt ends; a job
that is stopped gets `stop_signal` first (FLEET_CHECKPOINT_SIGNAL, SIGTERM by default), then
its grace, then SIGKILL.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workers.executor.accounts import Account, JobAccounts, own_account
from workers.executor.attempts import (
    Handle,
    abandon,
    create_time,
    dir_name,
    exit_status,
    handle_from_record,
    pid_from_shim,
    private_dir,
    record_write,
    records_read,
    stop_cause,
)
from workers.executor.cgroups import (
    Enforcement,
    job_cgroup_create,
    job_cgroup_remove,
    oom_kills,
)
from workers.executor.checkpoints import CheckpointStore
from workers.executor.spec import (
    ExecutorError,
    JobKey,
    JobSpec,
    LeaseExpired,
    inherited_environment,
    job_environment,
)

logger = logging.getLogger(__name__)

SHIM_PATH = str(Path(__file__).with_name("shim.py"))
SHIM_START_TIMEOUT_S = 10.0


class Executor:
    """Starts attempts through the shim and answers whether they have ended.

    `gpu_backend` is told about each job process when it can simulate load (the simulated
    backend); NVML needs nothing. Signals go to the job's whole process group. `accounts`
    picks the account each job runs as (default: `fleet-job`, never root); `base_env`
    (default: os.environ) is filtered through the allow-list plus `env_allow`;
    `scratch_dir` (default: `scratch` beside `state_dir`) holds the working directories of
    jobs that name none. `lease_path` names the agent's lease file (workers.lease): each
    job's shim stops the job when the lease runs out. `enforcement`
    (workers.executor.cgroups) says whether each attempt gets its own cgroup holding it to
    its CPUs and memory.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        base_env: Mapping[str, str] | None = None,
        env_allow: tuple[str, ...] = (),
        accounts: JobAccounts | None = None,
        scratch_dir: str | os.PathLike[str] | None = None,
        gpu_backend: Any = None,
        lease_path: str | os.PathLike[str] | None = None,
        enforcement: Enforcement | None = None,
        checkpoints: CheckpointStore | None = None,
        stop_signal: signal.Signals = signal.SIGTERM,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state_dir = Path(state_dir)
        private_dir(self.state_dir)
        self.lease_path = str(lease_path) if lease_path else None
        self.scratch_dir = Path(scratch_dir or self.state_dir.parent / "scratch")
        self.base_env = base_env
        self.env_allow = env_allow
        self.accounts = accounts or JobAccounts()
        self.gpu_backend = gpu_backend
        self.enforcement = enforcement or Enforcement(note="none: not asked to confine jobs")
        self.checkpoints = checkpoints
        self.stop_signal = stop_signal
        self.clock = clock
        self.handles: dict[JobKey, Handle] = {}
        self._adopt()

    # -- starting ---------------------------------------------------------------------------

    def start(self, spec: JobSpec) -> int:
        """Start the attempt and return the job's pid as soon as the process exists.
        Starting an attempt that is already known returns its pid (a redelivered start
        message starts nothing twice). Raises ExecutorError when it cannot start."""
        existing = self.handles.get(spec.key)
        if existing is not None:
            return existing.pid
        simulated = hasattr(self.gpu_backend, "register_job_process")
        if simulated:
            try:
                self.gpu_backend.check_job_load(
                    spec.gpu_indices,
                    env=spec.env,
                    gpu_memory_mb=spec.gpu_memory_mb,
                    gpu_compute_percent=spec.gpu_compute_percent,
                )
            except ValueError as exc:
                raise ExecutorError(f"cannot start job {spec.job_id}: {exc}") from exc
        try:
            account, account_name = self.accounts.resolve(user=spec.user, team=spec.team)
        except ExecutorError as exc:
            raise ExecutorError(f"cannot start job {spec.job_id}: {exc}") from exc
        checkpoint_dir, resumed = None, None
        if self.checkpoints is not None:
            try:
                resumed = self.checkpoints.prepare(
                    team=spec.team, job_id=spec.job_id, account=account
                )
            except ExecutorError as exc:
                raise ExecutorError(f"cannot start job {spec.job_id}: {exc}") from exc
            checkpoint_dir = str(self.checkpoints.path(spec.team, spec.job_id))
        attempt_dir = self.state_dir / dir_name(spec.key)
        if attempt_dir.exists():
            shutil.rmtree(attempt_dir)
        attempt_dir.mkdir(mode=0o700, parents=True)
        scratch = None if spec.workdir else self._make_scratch(spec, account)
        cgroup = self._make_cgroup(spec, scratch)
        identity = account or own_account()
        launch = {
            "command": spec.command,
            "workdir": spec.workdir or scratch,
            "env": job_environment(
                spec,
                self.base_env,
                allow=self.env_allow,
                account=identity.environment() if identity else None,
                checkpoint_dir=checkpoint_dir,
                stop_signal=self.stop_signal.name,
                mig_devices=getattr(self.gpu_backend, "mig_devices", None),
            ),
            "log_path": os.path.abspath(spec.log_path),
            "log_cap_bytes": spec.log_cap_bytes,
            "account": None
            if account is None
            else {"uid": account.uid, "gid": account.gid, "groups": list(account.groups)},
            "account_name": account_name,
            "lease_path": self.lease_path,
            "grace": spec.grace,
            "stop_signal": int(self.stop_signal),
            "cgroup": cgroup,
            "cgroup_mount": str(self.enforcement.mount) if cgroup else None,
        }
        fd = os.open(attempt_dir / "launch.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(launch, fh)
        with open(attempt_dir / "shim.err", "wb") as err:
            # The shim's own environment is the allow-listed part of the agent's, never the
            # whole: a job running as the agent's account could read it in /proc.
            shim = subprocess.Popen(
                [sys.executable, "-I", SHIM_PATH, str(attempt_dir)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env=inherited_environment(self.base_env, self.env_allow),
                start_new_session=True,
                close_fds=True,
            )
        # A record before the pid is known: an agent that dies while the shim starts the job
        # leaves its successor enough to adopt the job (or stop it), never an unknown orphan.
        record_write(
            Handle(
                spec=spec,
                pid=0,
                shim_pid=shim.pid,
                started_at=self.clock(),
                attempt_dir=str(attempt_dir),
                shim_create_time=create_time(shim.pid),
                scratch=scratch,
                cgroup=cgroup,
                checkpoint_dir=checkpoint_dir,
                resumed=resumed,
            )
        )
        line = self._first_line(shim)
        if not line.startswith("pid "):
            shim.wait(timeout=SHIM_START_TIMEOUT_S)
            shutil.rmtree(attempt_dir, ignore_errors=True)
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
            if cgroup:
                job_cgroup_remove(cgroup)
            if line.strip() == "lease":
                raise LeaseExpired(
                    f"job {spec.job_id} was not started: the node's lease had run out (no "
                    "word from the control side), which may run the job elsewhere by now"
                )
            detail = line.removeprefix("error ").strip() or "the launcher exited without a pid"
            raise ExecutorError(f"cannot start job {spec.job_id}: {detail}")
        pid = int(line.split()[1])
        handle = Handle(
            spec=spec,
            pid=pid,
            shim_pid=shim.pid,
            started_at=self.clock(),
            attempt_dir=str(attempt_dir),
            shim_create_time=create_time(shim.pid),
            shim=shim,
            scratch=scratch,
            cgroup=cgroup,
            checkpoint_dir=checkpoint_dir,
            resumed=resumed,
        )
        record_write(handle)
        self.handles[spec.key] = handle
        self._simulate_load(handle)
        return pid

    def _make_scratch(self, spec: JobSpec, account: Account | None) -> str:
        """A fresh working directory for the attempt, owned by its account, mode 0700, in
        a scratch root the job can pass through but not list."""
        try:
            if not self.scratch_dir.exists():
                self.scratch_dir.mkdir(parents=True)
                self.scratch_dir.chmod(0o711)
            path = tempfile.mkdtemp(prefix=dir_name(spec.key) + "-", dir=self.scratch_dir)
            if account is not None:
                os.chown(path, account.uid, account.gid)
        except OSError as exc:
            raise ExecutorError(
                f"cannot start job {spec.job_id}: cannot make its working directory in "
                f"{self.scratch_dir}: {exc}"
            ) from exc
        return path

    def _make_cgroup(self, spec: JobSpec, scratch: str | None) -> str | None:
        """The attempt's own cgroup with its CPU and memory limits, where the agent confines
        jobs; None where it does not (the job then runs unconfined)."""
        root = self.enforcement.root
        if root is None:
            return None
        try:
            return str(
                job_cgroup_create(
                    root, dir_name(spec.key), cpus=spec.cpus, memory_mb=spec.memory_mb
                )
            )
        except OSError as exc:
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
            raise ExecutorError(
                f"cannot start job {spec.job_id}: cannot make its cgroup under {root}: "
                f"{exc.strerror or exc}"
            ) from exc

    def _simulate_load(self, handle: Handle) -> None:
        if not hasattr(self.gpu_backend, "register_job_process"):
            return
        spec = handle.spec
        try:
            self.gpu_backend.register_job_process(
                handle.pid,
                spec.gpu_indices,
                env=spec.env,
                gpu_memory_mb=spec.gpu_memory_mb,
                gpu_compute_percent=spec.gpu_compute_percent,
            )
        except ValueError as exc:
            logger.warning("no simulated load for job %s: %s", spec.key, exc)

    @staticmethod
    def _first_line(shim: subprocess.Popen[bytes]) -> str:
        assert shim.stdout is not None
        deadline = time.monotonic() + SHIM_START_TIMEOUT_S
        buf = b""
        while b"\n" not in buf and time.monotonic() < deadline:
            ready, _, _ = select.select([shim.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(shim.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
        shim.stdout.close()
        return buf.decode(errors="replace").splitlines()[0] if buf else ""

    def _adopt(self) -> None:
        """Find the attempts an earlier agent on this `state_dir` started."""
        for attempt_dir, record, spec in records_read(self.state_dir):
            pid = record["pid"] or pid_from_shim(attempt_dir)
            if not pid:
                abandon(attempt_dir, record)
                continue
            handle = handle_from_record(attempt_dir, record, spec, pid)
            self.handles[spec.key] = handle
            if self.exit_status(spec.key) is None:
                self._simulate_load(handle)

    # -- state ------------------------------------------------------------------------------

    def exit_status(self, key: JobKey) -> int | str | None:
        """None while the job runs; its return code once it has ended (negative: killed
        by that signal); LOST when its shim vanished without saying."""
        return exit_status(self.handles[key])

    def stop_cause(self, key: JobKey) -> str | None:
        """Why the shim stopped an ended attempt on its own ("lease"), or None."""
        return stop_cause(self.handles.get(key))

    def memory_killed(self, key: JobKey) -> bool:
        """Whether the kernel killed a process of the attempt at its cgroup's memory limit."""
        handle = self.handles.get(key)
        return bool(handle and handle.cgroup and oom_kills(handle.cgroup))

    def signal_group(self, key: JobKey, sig: signal.Signals) -> bool:
        """Send `sig` to the job's process group; False when the group is already gone."""
        handle = self.handles.get(key)
        if handle is None:
            return False
        if (Path(handle.attempt_dir) / "status.json").exists():
            return False  # ended: its pgid may no longer be ours to signal
        try:
            os.killpg(handle.pgid, sig)
        except ProcessLookupError:
            return False
        return True

    def forget(self, key: JobKey) -> None:
        """Drop an ended attempt: release its simulated load and its state directory.
        The log file stays."""
        handle = self.handles.pop(key, None)
        if handle is None:
            return
        if hasattr(self.gpu_backend, "unregister_job_process"):
            self.gpu_backend.unregister_job_process(handle.pid)
        if handle.shim is not None:
            try:
                handle.shim.wait(timeout=5)
            except subprocess.TimeoutExpired:
                logger.warning("shim %s of job %s did not exit", handle.shim_pid, key)
        if handle.cgroup:
            job_cgroup_remove(handle.cgroup)
        shutil.rmtree(handle.attempt_dir, ignore_errors=True)
        if handle.scratch:
            shutil.rmtree(handle.scratch, ignore_errors=True)
        if handle.checkpoint_dir and self.checkpoints is not None:
            # Kept for the next attempt; its retention counts from now.
            self.checkpoints.touch(team=handle.spec.team, job_id=handle.spec.job_id)

    def checkpoints_in_use(self) -> list[tuple[str | None, Any]]:
        """(team, job_id) of every attempt known here: their directories are never swept,
        and each is marked used (on every heartbeat while it runs)."""
        # A copy first: the supervisor's thread adds and forgets attempts meanwhile.
        handles = list(self.handles.values())
        return [(h.spec.team, h.spec.job_id) for h in handles if h.checkpoint_dir]
