"""Per-attempt shim: the parent of one job process, outside the agent.

Run as `python -I shim.py ATTEMPT_DIR` by the executor, in its own session. It reads
ATTEMPT_DIR/launch.json (command, workdir, env, log path and cap, account) and deletes it,
starts `/bin/sh -c COMMAND` in a new session (so the job's process group id is its pid) in
the working directory, as the job's account when one is given (the shim itself keeps the
agent's account, so it can write the log and status files the job cannot read), prints
`pid N` (or `error MESSAGE`) on stdout, then:

- copies the job's stdout and stderr into the log file until the cap, appends one marker
  line, and keeps reading and discarding, so the job never blocks on a full pipe;
- reaps the job and, as a child subreaper, every orphan the job leaves behind;
- when the job's main process exits, kills what is left of its process group (the job is
  over; leftovers would keep holding GPUs), waits for the group to vanish, and writes
  ATTEMPT_DIR/status.json: {"returncode": N}, negative for a signal, as in subprocess.

Where the agent confines jobs (workers.executor.cgroups), launch.json names the attempt's
cgroup: the shim joins it before it starts the job, so the job and all it starts are in it
from the first instruction, and goes back to its own cgroup right after, so the job's
limits never count against or kill the shim.

Because the shim, not the agent, holds the pipe and the exit status, an agent restart
neither kills the job (no SIGPIPE on its output) nor loses how it ended.

The shim also enforces the agent's lease (workers.lease): once the file at `lease_path`
says the lease has run out, it stops the job (`stop_signal` to the group, SIGTERM unless
the agent's FLEET_CHECKPOINT_SIGNAL names another, `grace` seconds, SIGKILL) and records `"cause": "lease"` in status.json, so no job runs on after its node
lost touch with the control side, even when the agent itself is dead or frozen.
Standard library only: it runs with `-I`, whatever the job's environment holds.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
LEASE_CHECK_S = 1.0
DRAIN_AFTER_EXIT_S = 2.0
GROUP_GONE_WAIT_S = 5.0
CHUNK = 65536


def _become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans go to init, which reaps them


class CappedLog:
    def __init__(self, path: str, cap: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.file = open(fd, "ab", buffering=0)  # noqa: SIM115 - lives as long as the shim
        self.cap = cap
        self.written = 0
        self.truncated = False

    def write(self, data: bytes) -> None:
        if self.truncated:
            return
        room = self.cap - self.written
        if len(data) <= room:
            self.file.write(data)
            self.written += len(data)
            return
        self.file.write(data[:room])
        self.written += room
        self.truncated = True
        self.file.write(
            f"\n[fleet] log truncated: reached the cap of {self.cap:,} bytes; "
            "further output is discarded\n".encode()
        )


def _reap(leader: int) -> int | None:
    """Reap every exited child; return the leader's exit code if it was among them."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            return code
        if pid == leader:
            code = os.waitstatus_to_exitcode(status)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _enter_workdir(workdir: str, account: dict | None, name: str) -> str | None:
    """chdir into the job's working directory with the job's rights, so the job never gets
    a directory its account could not enter by itself; an error message, or None."""
    if account is None:
        try:
            os.chdir(workdir)
        except OSError as exc:
            return f"cannot enter the working directory {workdir}: {exc.strerror}"
        return None
    groups = os.getgroups()
    try:
        os.setgroups(account["groups"])
        os.setegid(account["gid"])
        os.seteuid(account["uid"])
        os.chdir(workdir)
    except OSError as exc:
        return (
            f"the job's account {name} cannot enter its working directory {workdir}: {exc.strerror}"
        )
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)
    return None


def lease_expired(path: str | None) -> bool:
    """Whether the lease file at `path` says the lease has run out (no file, or one that
    cannot be read: no lease to enforce)."""
    try:
        with open(path or "") as fh:
            until = float(fh.read().strip())
    except (OSError, ValueError):
        return False
    return time.time() > until


class LeaseWatch:
    """Reads the lease file about once a second; says when to stop the job and when to
    kill it. A missing or unreadable file is no lease to enforce (an executor used without
    an agent)."""

    def __init__(self, path: str | None, grace: float, stop_signal: int = signal.SIGTERM) -> None:
        self.path = path
        self.grace = grace
        self.stop_signal = signal.Signals(stop_signal)
        self.next_check = 0.0
        self.kill_at: float | None = None
        self.killed = False

    def _expired(self) -> bool:
        return lease_expired(self.path)

    def tick(self, leader: int) -> None:
        now = time.monotonic()
        if self.kill_at is None:
            if self.path is None or now < self.next_check:
                return
            self.next_check = now + LEASE_CHECK_S
            if self._expired():
                self.kill_at = now + self.grace
                _signal_group(leader, self.stop_signal)
        elif not self.killed and now >= self.kill_at:
            self.killed = True
            _signal_group(leader, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _own_cgroup(mount: str) -> str | None:
    """The cgroup v2 directory this process is in, under `mount`."""
    try:
        with open("/proc/self/cgroup") as fh:
            for line in fh:
                if line.startswith("0::"):
                    return os.path.join(mount, line[3:].strip().lstrip("/"))
    except OSError:
        pass
    return None


def _join_cgroup(path: str) -> str | None:
    """Move this process into the cgroup at `path`; an error message, or None."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    except OSError as exc:
        return f"cannot join its cgroup {path}: {exc.strerror or exc}"
    return None


def _tell_agent(line: str) -> None:
    """Say one line to the agent that started the shim. The agent may have died meanwhile
    (its end of the pipe is closed): the job then runs on unheard, still supervised here,
    lease included, and a restarted agent adopts it from its record."""
    try:
        print(line, flush=True)
    except OSError:
        pass


def main(attempt_dir: str) -> int:
    launch_path = os.path.join(attempt_dir, "launch.json")
    with open(launch_path) as fh:
        launch = json.load(fh)
    os.unlink(launch_path)  # it holds the job's environment, secrets included
    os.umask(0o077)  # the log and status files are the agent's, not the job's
    _become_subreaper()
    account = launch.get("account")
    error = _enter_workdir(launch["workdir"], account, launch.get("account_name", ""))
    if error:
        _tell_agent(f"error {error}")
        return 2
    cgroup, home = launch.get("cgroup"), None
    if cgroup:
        home = _own_cgroup(launch.get("cgroup_mount") or "/sys/fs/cgroup")
        error = _join_cgroup(cgroup)
        if error:
            _tell_agent(f"error {error}")
            return 2
    as_account = (
        {"user": account["uid"], "group": account["gid"], "extra_groups": account["groups"]}
        if account
        else {}
    )
    if lease_expired(launch.get("lease_path")):
        # The agent took the start with a lease that has run out since (it was frozen or cut
        # off after checking the start's fence): the control side may run the attempt's
        # successor elsewhere already, so this one never starts.
        _tell_agent("lease")
        return 2
    try:
        os.makedirs(os.path.dirname(os.path.abspath(launch["log_path"])), exist_ok=True)
        log = CappedLog(launch["log_path"], int(launch["log_cap_bytes"]))
        read_fd, write_fd = os.pipe()
        proc = subprocess.Popen(
            ["/bin/sh", "-c", launch["command"]],
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            env=launch["env"],
            start_new_session=True,
            close_fds=True,
            umask=0o022,
            **as_account,
        )
    except OSError as exc:
        _tell_agent(f"error {exc}")
        return 2
    os.close(write_fd)
    if home:
        _join_cgroup(home)  # failing that, the shim stays beside its job and still reports
    # For an agent that dies before it hears the pid: its successor adopts the job from here.
    pid_path = os.path.join(attempt_dir, "job.pid")
    with open(pid_path + ".tmp", "w") as fh:
        fh.write(str(proc.pid))
    os.replace(pid_path + ".tmp", pid_path)
    _tell_agent(f"pid {proc.pid}")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the agent stops reading; never block or die writing to it

    leader = proc.pid
    lease = LeaseWatch(
        launch.get("lease_path"),
        float(launch.get("grace", 30.0)),
        int(launch.get("stop_signal") or signal.SIGTERM),
    )
    returncode: int | None = None
    eof = False
    drain_until = None
    while True:
        if not eof:
            ready, _, _ = select.select([read_fd], [], [], 0.1)
            if ready:
                data = os.read(read_fd, CHUNK)
                if data:
                    log.write(data)
                else:
                    eof = True
        else:
            time.sleep(0.05)
        if returncode is None:
            lease.tick(leader)
        code = _reap(leader)
        if code is not None:
            returncode = code
            proc.returncode = code  # reaped here; keep Popen from waiting again
        if returncode is not None:
            if drain_until is None:
                try:
                    os.killpg(leader, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                drain_until = time.monotonic() + DRAIN_AFTER_EXIT_S
            if eof or time.monotonic() > drain_until:
                break

    gone_by = time.monotonic() + GROUP_GONE_WAIT_S
    while _group_alive(leader) and time.monotonic() < gone_by:
        try:
            os.killpg(leader, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _reap(leader)
        time.sleep(0.02)
    _reap(leader)
    log.file.close()

    status_path = os.path.join(attempt_dir, "status.json")
    tmp = status_path + ".tmp"
    with open(tmp, "w") as fh:
        status: dict[str, object] = {"returncode": returncode, "ended_at": time.time()}
        if lease.kill_at is not None:
            status["cause"] = "lease"
        json.dump(status, fh)
    os.replace(tmp, status_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
