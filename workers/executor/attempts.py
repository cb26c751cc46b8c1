"""An attempt's directory on disk, and what it tells about the attempt.

Each attempt the executor starts gets a directory under the executor's `state_dir` (0700)
holding `record.json` (who runs, since when, with what limits: what a restarted agent needs
to find the attempt again) and, once the job has ended, `status.json` written by the shim
(`workers.executor.shim`). Whether an attempt still runs is read from its shim: alive, and
the same process (its create time) as the one started.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from workers.executor.cgroups import job_cgroup_remove
from workers.executor.spec import JobKey, JobSpec

logger = logging.getLogger("workers.executor.launcher")

LOST = "lost"  # exit_status() when neither the job nor its shim can tell how it ended


@dataclass
class Handle:
    """One attempt the executor knows about."""

    spec: JobSpec
    pid: int
    shim_pid: int
    started_at: float
    attempt_dir: str
    shim_create_time: float | None = None
    shim: subprocess.Popen[bytes] | None = None  # None for attempts adopted after a restart
    scratch: str | None = None  # the per-attempt working directory fleet made, if any
    cgroup: str | None = None  # the attempt's own cgroup (workers.executor.cgroups), if any
    checkpoint_dir: str | None = None  # FLEET_CHECKPOINT_DIR, kept across attempts
    resumed: bool | None = None  # whether it held anything at the start (None: no store)

    @property
    def pgid(self) -> int:
        return self.pid  # the job runs in its own session


def dir_name(key: JobKey) -> str:
    """The attempt directory's name for `key`."""
    job_id, attempt = key
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{job_id}.{attempt}")


def private_dir(path: Path) -> None:
    """Make `path` (and its parents) if missing, and make it 0700 even if it existed."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)


def pid_from_shim(attempt_dir: Path) -> int:
    """The job's pid as its shim wrote it once the job started; 0 when it has not."""
    try:
        return int((attempt_dir / "job.pid").read_text())
    except (OSError, ValueError):
        return 0


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def record_write(handle: Handle) -> None:
    """Write (replace) the attempt's record."""
    spec = asdict(handle.spec)
    # The job's environment may hold secrets; keep only the simulated-load declaration,
    # which a restarted agent needs to keep simulating the job.
    spec["env"] = {k: v for k, v in spec["env"].items() if k.startswith("FLEET_SIM_")}
    record = {
        "spec": spec,
        "pid": handle.pid,
        "shim_pid": handle.shim_pid,
        "shim_create_time": handle.shim_create_time,
        "started_at": handle.started_at,
        "scratch": handle.scratch,
        "cgroup": handle.cgroup,
        "checkpoint_dir": handle.checkpoint_dir,
        "resumed": handle.resumed,
    }
    path = Path(handle.attempt_dir) / "record.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def records_read(state_dir: Path) -> Iterator[tuple[Path, dict[str, Any], JobSpec]]:
    """(attempt directory, record, spec) of every readable attempt record under
    `state_dir`, in name order; an unreadable one is logged and skipped."""
    for record_path in sorted(state_dir.glob("*/record.json")):
        try:
            record = json.loads(record_path.read_text())
            spec = JobSpec.from_record(record["spec"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring unreadable attempt record %s: %s", record_path, exc)
            continue
        yield record_path.parent, record, spec


def handle_from_record(
    attempt_dir: Path, record: dict[str, Any], spec: JobSpec, pid: int
) -> Handle:
    """The handle of an attempt found on disk (no shim process object: it was started by
    an earlier agent)."""
    return Handle(
        spec=spec,
        pid=pid,
        shim_pid=record["shim_pid"],
        started_at=record["started_at"],
        attempt_dir=str(attempt_dir),
        shim_create_time=record.get("shim_create_time"),
        scratch=record.get("scratch"),
        cgroup=record.get("cgroup"),
        checkpoint_dir=record.get("checkpoint_dir"),
        resumed=record.get("resumed"),
    )


def abandon(attempt_dir: Path, record: dict[str, Any]) -> None:
    """An attempt whose shim never said it started the job: stop the shim, drop the
    attempt. Its start was never confirmed, so the control side takes it back."""
    shim_pid = int(record.get("shim_pid") or 0)
    created = record.get("shim_create_time")
    if shim_pid > 0 and created is not None and create_time(shim_pid) == created:
        try:
            os.kill(shim_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    logger.warning("dropped attempt %s: its job never started", attempt_dir.name)
    if record.get("cgroup"):
        job_cgroup_remove(record["cgroup"])
    shutil.rmtree(attempt_dir, ignore_errors=True)


def exit_status(handle: Handle) -> int | str | None:
    """None while the job runs; its return code once it has ended (negative: killed
    by that signal); LOST when its shim vanished without saying."""
    status_path = Path(handle.attempt_dir) / "status.json"
    if status_path.exists():
        try:
            code = json.loads(status_path.read_text())["returncode"]
        except (OSError, ValueError, KeyError):
            return LOST
        return LOST if code is None else int(code)
    if shim_alive(handle):
        return None
    # The shim writes the status before exiting; look once more to close that race.
    return exit_status(handle) if status_path.exists() else LOST


def stop_cause(handle: Handle | None) -> str | None:
    """Why the shim stopped an ended attempt on its own ("lease"), or None."""
    if handle is None:
        return None
    try:
        status = json.loads((Path(handle.attempt_dir) / "status.json").read_text())
    except (OSError, ValueError):
        return None
    cause = status.get("cause") if isinstance(status, dict) else None
    return str(cause) if cause else None


def shim_alive(handle: Handle) -> bool:
    if handle.shim is not None:
        return handle.shim.poll() is None
    try:
        proc = psutil.Process(handle.shim_pid)
        alive = proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
    created = handle.shim_create_time
    return alive and (created is None or abs(proc.create_time() - created) < 1.0)
