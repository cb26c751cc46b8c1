"""Checkpoint directories: where a job keeps what it needs to resume, across its attempts.

Every job gets `<root>/<team>/<job_id>/` (FLEET_CHECKPOINT_DIR in its environment). The
agent makes it before the attempt starts, owned by the account the job runs as, mode 0700,
and leaves it in place when the attempt ends, so the next attempt of the same job finds
what the last one wrote: on this node always, on any node when `root` is storage every node
mounts at the same path (FLEET_CHECKPOINT_ROOT, a shared filesystem the admin names).

`root` and each team directory belong to the agent, mode 0711: a job reaches its own
directory but cannot list or enter another job's. An attempt *resumes* when its directory
holds anything at its start; that is what the agent reports, and what counts as the job
declaring that it checkpoints.

Directories are kept for `retention_s` after their job last ran anywhere (0: forever). The
agent notes every use in an agent-owned marker beside the directory (`<job_id>.used`, whose
mtime it sets when an attempt starts, on every heartbeat while it runs, and when it ends),
and `sweep` removes a directory only once no agent sharing the root has marked it for the
whole retention, and never one of an attempt running on this node.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from workers.executor.accounts import Account
from workers.executor.spec import ExecutorError

logger = logging.getLogger(__name__)

DEFAULT_RETENTION_S = 14 * 86400.0
MARKER_SUFFIX = ".used"
NO_TEAM = "_"
# The checkpoint signal may be any a process can catch; SIGKILL and SIGSTOP cannot be.
UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})


def _safe(name: str) -> str:
    """A path component from a team slug or job id: no separators, never '.' or '..'."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".")
    return cleaned or NO_TEAM


def parse_signal(raw: str | None) -> signal.Signals:
    """FLEET_CHECKPOINT_SIGNAL: a name (SIGUSR1 or USR1) or number; SIGTERM when empty.
    Raises ValueError with a sentence an admin can act on."""
    text = (raw or "").strip()
    if not text:
        return signal.SIGTERM
    try:
        if text.isdigit():
            sig = signal.Signals(int(text))
        else:
            upper = text.upper()
            sig = signal.Signals[upper if upper.startswith("SIG") else "SIG" + upper]
    except (KeyError, ValueError):
        raise ValueError(
            f"FLEET_CHECKPOINT_SIGNAL={text!r} is not a signal; give a name such as SIGTERM "
            "or SIGUSR1"
        ) from None
    if sig in UNCATCHABLE:
        raise ValueError(
            f"FLEET_CHECKPOINT_SIGNAL={text!r} cannot be caught by a job, so it could not "
            "checkpoint; give one it can trap, such as SIGTERM or SIGUSR1"
        )
    return sig


@dataclass
class CheckpointStore:
    """The checkpoint directories under `root`; see the module docstring."""

    root: Path
    retention_s: float = DEFAULT_RETENTION_S
    clock: Callable[[], float] = field(default=time.time)

    def path(self, team: str | None, job_id: object) -> Path:
        return self.root / _safe(team or NO_TEAM) / _safe(str(job_id))

    def _marker(self, path: Path) -> Path:
        return path.with_name(path.name + MARKER_SUFFIX)

    def _agent_dir(self, path: Path) -> None:
        """A directory of the agent that jobs may pass through but not list."""
        if not path.exists():
            path.mkdir(mode=0o711, parents=True, exist_ok=True)
            path.chmod(0o711)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise OSError(f"{path} is not a directory")

    def prepare(self, *, team: str | None, job_id: object, account: Account | None) -> bool:
        """Make the job's directory if it is missing (owned by `account`, or by the agent's
        own account when None), mark it used, and say whether it already held anything:
        True when the attempt resumes from what an earlier one left. Raises ExecutorError
        when the directory cannot be made (the job is then not started)."""
        path = self.path(team, job_id)
        try:
            self._agent_dir(self.root)
            self._agent_dir(path.parent)
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:
                pass
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode):
                raise OSError(f"{path} is not a directory")
            if account is not None and (info.st_uid, info.st_gid) != (account.uid, account.gid):
                os.chown(path, account.uid, account.gid, follow_symlinks=False)
            if stat.S_IMODE(info.st_mode) != 0o700:
                path.chmod(0o700)
            with os.scandir(path) as entries:
                resumed = any(True for _ in entries)
            self.touch(team=team, job_id=job_id)
        except OSError as exc:
            raise ExecutorError(
                f"cannot make its checkpoint directory {path} (FLEET_CHECKPOINT_ROOT="
                f"{self.root}): {exc.strerror or exc}"
            ) from exc
        return resumed

    def touch(self, *, team: str | None, job_id: object) -> None:
        """Note that the job's directory is in use now (its retention starts again)."""
        marker = self._marker(self.path(team, job_id))
        now = self.clock()
        try:
            marker.touch(mode=0o600)
            os.utime(marker, (now, now))
        except OSError as exc:
            logger.warning("cannot mark checkpoint directory %s used: %s", marker, exc)

    def sweep(self, keep: Iterable[tuple[str | None, object]] = ()) -> list[Path]:
        """Remove the directories no agent has used for the retention; `keep` are the
        (team, job_id) of attempts running here, never removed. Returns what was removed.
        A directory without a marker (made by hand, or by an older agent) gets one now,
        so its retention starts today."""
        if self.retention_s <= 0 or not self.root.is_dir():
            return []
        kept = {self.path(team, job_id) for team, job_id in keep}
        cutoff = self.clock() - self.retention_s
        removed = []
        for team_dir in self.root.iterdir():
            if team_dir.is_symlink() or not team_dir.is_dir():
                continue
            for path in team_dir.iterdir():
                if path.name.endswith(MARKER_SUFFIX) or path in kept:
                    continue
                if path.is_symlink() or not path.is_dir():
                    continue
                marker = self._marker(path)
                try:
                    used = marker.stat().st_mtime
                except FileNotFoundError:
                    self.touch(team=team_dir.name, job_id=path.name)
                    continue
                if used >= cutoff:
                    continue
                shutil.rmtree(path, ignore_errors=True)
                if not path.exists():
                    marker.unlink(missing_ok=True)
                    removed.append(path)
                    logger.info(
                        "removed checkpoint directory %s: unused for %.0f days",
                        path,
                        self.retention_s / 86400,
                    )
        return removed
