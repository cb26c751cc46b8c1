"""The execution log: every job of the fault suite records, with `flock`, one line when its
command starts, one every second while it runs, and one when it ends (or is told to stop),
in one file shared by all agents of the test. The assertions read what really ran from it,
not what the database believes ran.

A line is `<event> <unix time> <node> <job id> <attempt> <gpus> <pid>`; `event` is start,
tick (every half second), end (the command finished: exit 0 follows), term (SIGTERM or
SIGINT arrived) or exit (after a SIGTERM, the job spent half a second "checkpointing",
as a training job would within its grace, and exits 143). A job killed with SIGKILL writes
nothing more: its last line is the last moment it is known to have run.

A SIGTERM can land between `end` and the exit (the node's lease ran out that instant): the
process then exits 143, not 0, so its node rightly reports it stopped, and it has not
completed; running it again is no violation.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

JOB_SCRIPT = r"""#!/bin/sh
# A fault-suite job: `sh job.sh SECONDS` records its execution in the shared log.
log='{log}'
secs=${{1:-3}}
gpus=${{CUDA_VISIBLE_DEVICES:-none}}
me="${{FAULTS_NODE:-unknown}} ${{FLEET_JOB_ID:-?}} ${{FLEET_ATTEMPT:-?}} $gpus $$"
rec() {{ ( flock 9; echo "$1 $(date +%s.%N) $me" >&9 ) 9>>"$log"; }}
on_term() {{
  trap '' TERM INT
  rec term
  sleep 0.25; rec tick; sleep 0.25; rec tick
  rec exit
  exit 143
}}
trap on_term TERM INT
rec start
i=0
while [ "$i" -lt $((secs * 2)) ]; do
  sleep 0.5 &
  wait $!
  i=$((i + 1))
  rec tick
done
rec end
"""


@dataclass
class Execution:
    node: str
    pid: int
    job_id: int
    attempt: int
    gpus: tuple[int, ...]
    start: float
    last_seen: float
    ended: str | None = None  # "end" (completed) or "term" (stopped); None: no word yet
    end: float | None = None  # its last line once it has said it ends (end, or exit after term)
    alive: bool = False  # still running when the log was read
    stopped_after_end: bool = False  # SIGTERM after its end line: it exited 143, not 0

    @property
    def completed(self) -> bool:
        return self.ended == "end" and not self.stopped_after_end

    def until(self, now: float) -> float:
        """The latest moment it is known to have run: now if it is still running, else the
        last line it wrote (its end or exit line; a job killed with SIGKILL writes none)."""
        return now if self.alive else self.last_seen

    def describe(self) -> str:
        gpus = ",".join(map(str, self.gpus)) or "none"
        how = self.ended or ("still running" if self.alive else "killed, no end line")
        if self.stopped_after_end:
            how = "end, then stopped before it exited: exit 143"
        return (
            f"job {self.job_id} attempt {self.attempt} on {self.node} GPUs {gpus} pid "
            f"{self.pid}: {self.start:.2f}..{(self.end or self.last_seen):.2f} ({how})"
        )


class ExecutionLog:
    """The shared folder (world-writable: jobs run as an unprivileged account), the job
    script in it, and the reading of the log."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o1777)
        self.path = folder / "executions.log"
        self.path.touch()
        os.chmod(self.path, 0o666)
        self.script = folder / "job.sh"
        self.script.write_text(JOB_SCRIPT.format(log=self.path))
        os.chmod(self.script, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)

    def command(self, seconds: int) -> str:
        # exec: the script is the process group's leader, so a SIGTERM to the group reaches
        # its trap before the agent's launcher, seeing the leader gone, SIGKILLs the rest.
        return f"exec sh {self.script} {int(seconds)}"

    def read(self) -> list[Execution]:
        runs: dict[tuple[str, int], Execution] = {}
        for line in self.path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 7:
                continue
            event, at, node, job_id, attempt, gpus, pid = parts
            try:
                key = (node, int(pid))
                t = float(at)
                run = runs.get(key)
                if run is None:
                    run = runs[key] = Execution(
                        node=node,
                        pid=int(pid),
                        job_id=int(job_id),
                        attempt=int(attempt),
                        gpus=() if gpus == "none" else tuple(int(g) for g in gpus.split(",")),
                        start=t,
                        last_seen=t,
                    )
            except ValueError:
                continue
            if event == "start":
                run.start = min(run.start, t)
            run.last_seen = max(run.last_seen, t)
            if event in ("end", "term") and run.ended is None:
                run.ended = event
            elif event == "term" and run.ended == "end":
                run.stopped_after_end = True
            if event in ("end", "exit"):
                run.end = max(run.end or t, t)
        for run in runs.values():
            run.alive = run.end is None and _is_job(run.pid)
        return sorted(runs.values(), key=lambda r: r.start)


def _is_job(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"job.sh" in cmdline
