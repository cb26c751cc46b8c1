"""What must hold whatever fault was injected (issue 10), read from what really ran (the
execution log) beside what the database recorded (the job API).

`check` returns every violation found; `Report` prints them with the job and the
executions involved, and the issue's summary line (ran twice, double-booked, stuck).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import combinations
from typing import Any

from tests.faults.executions import Execution

TERMINAL = frozenset({"succeeded", "failed", "timeout", "cancelled"})
# A start line is written a moment after the agent launched the command: a start that
# the agent decided on just before the job's end was recorded may print just after it.
START_SLACK_S = 0.5


@dataclass
class Violation:
    invariant: str
    job_id: int | None
    detail: str
    executions: list[Execution] = field(default_factory=list)

    def describe(self) -> str:
        head = f"[{self.invariant}]" + (f" job {self.job_id}" if self.job_id is not None else "")
        lines = [f"{head}: {self.detail}"]
        lines += [f"      {run.describe()}" for run in self.executions]
        return "\n".join(lines)


def timestamp(value: Any) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _overlap(a: Execution, b: Execution, now: float) -> float:
    """Seconds during which both ran (0 when they did not overlap)."""
    return max(0.0, min(a.until(now), b.until(now)) - max(a.start, b.start))


def final_event_time(job: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> float | None:
    """When the job's current terminal state was recorded (its last applied event into
    that state), or None when it is not in one."""
    if job["state"] not in TERMINAL:
        return None
    for event in reversed(events):
        if event.get("applied", True) and event["to_state"] == job["state"]:
            return timestamp(event["at"])
    return None


def is_gang(job: Mapping[str, Any]) -> bool:
    """A job over several nodes: one execution per member (node) of each attempt."""
    return int(job.get("nodes") or 1) > 1


def member_nodes(job: Mapping[str, Any]) -> set[str]:
    """The nodes the job's current attempt runs on: one per member of a multi-node job,
    else the job's node."""
    members = {str(m["node"]) for m in job.get("members") or () if m.get("node")}
    if members:
        return members
    return {str(job["node"])} if job.get("node") else set()


def check(
    *,
    executions: Sequence[Execution],
    jobs: Mapping[int, Mapping[str, Any]],
    events: Mapping[int, Sequence[Mapping[str, Any]]],
    now: float,
    allow_rerun_after_completion: bool = False,
    expect_states: Mapping[int, str] | None = None,
) -> list[Violation]:
    """Every violated invariant:

    - succeeded-without-execution: a job is succeeded but no execution of its attempt
      completed (for a multi-node job: on one of its members' nodes);
    - ran-concurrently: two executions of one job overlapped in time (the members of one
      attempt of a multi-node job run together, one per node; a member of an old attempt
      beside a new one is a violation);
    - ran-after-end: an execution started after the job's terminal state (success,
      cancel, ...) was recorded;
    - rerun-after-completion: an execution started after another execution of the same
      job had completed (a finished job run again; by design only a partition longer than
      the lease may do that, and `allow_rerun_after_completion` says so);
    - gpu-double-booked: one GPU (node, index) used by two executions at once;
    - not-terminal: a job not finished by the end (stuck);
    - runs-unaccounted: an execution still running whose job is finished or runs another
      attempt or on another node (an orphan nobody will stop or report);
    - unexpected-state: a job that ended in another state than the test expects.
    """
    found: list[Violation] = []
    by_job: dict[int, list[Execution]] = defaultdict(list)
    for run in executions:
        by_job[run.job_id].append(run)

    for job_id, job in sorted(jobs.items()):
        runs = by_job.get(job_id, [])
        nodes_done = {r.node for r in runs if r.completed and r.attempt == job["attempt"]}
        if job["state"] == "succeeded" and len(nodes_done) < len(member_nodes(job)):
            found.append(
                Violation(
                    "succeeded-without-execution",
                    job_id,
                    f"recorded succeeded on attempt {job['attempt']}, but no execution of that "
                    "attempt completed"
                    + (
                        f" on {', '.join(sorted(member_nodes(job) - nodes_done))}"
                        if is_gang(job)
                        else ""
                    ),
                    runs,
                )
            )
        for a, b in combinations(runs, 2):
            if is_gang(job) and a.attempt == b.attempt and a.node != b.node:
                continue  # two members of one attempt: the gang runs them together
            both = _overlap(a, b, now)
            if both > 0:
                what = (
                    f"a member of attempt {min(a.attempt, b.attempt)} ran beside attempt "
                    f"{max(a.attempt, b.attempt)}"
                    if a.attempt != b.attempt
                    else "two executions"
                )
                found.append(
                    Violation(
                        "ran-concurrently",
                        job_id,
                        f"{what} ran at the same time for {both:.1f} s"
                        if a.attempt == b.attempt
                        else f"{what} for {both:.1f} s",
                        [a, b],
                    )
                )
        ended_at = final_event_time(job, events.get(job_id, []))
        if ended_at is not None:
            late = [r for r in runs if r.start > ended_at + START_SLACK_S]
            if late:
                found.append(
                    Violation(
                        "ran-after-end",
                        job_id,
                        f"started after the job was recorded {job['state']} (at {ended_at:.2f})",
                        late,
                    )
                )
        if not allow_rerun_after_completion:
            done = [r for r in runs if r.completed]
            if done:
                first_done = min(done, key=lambda r: r.end or 0)
                again = [
                    r
                    for r in runs
                    if r.start > (first_done.end or 0)
                    # Members of the same attempt end one after another, not again.
                    and not (is_gang(job) and r.attempt == first_done.attempt)
                ]
                if again:
                    found.append(
                        Violation(
                            "rerun-after-completion",
                            job_id,
                            "ran again after an execution had completed",
                            [first_done, *again],
                        )
                    )
        if job["state"] not in TERMINAL:
            live = [r for r in runs if r.alive]
            found.append(
                Violation(
                    "not-terminal",
                    job_id,
                    f"still {job['state']} (attempt {job['attempt']}, node {job.get('node')}, "
                    f"reason {job.get('state_reason')!r}); "
                    f"{len(live)} live execution(s)",
                    live,
                )
            )
        for run in runs:
            if not run.alive:
                continue
            current = (
                job["state"] in ("assigned", "running")
                and run.attempt == job["attempt"]
                and run.node in member_nodes(job)
            )
            if not current:
                found.append(
                    Violation(
                        "runs-unaccounted",
                        job_id,
                        f"still running although the job is {job['state']} on attempt "
                        f"{job['attempt']} (nodes {', '.join(sorted(member_nodes(job))) or '-'})",
                        [run],
                    )
                )
        wanted = (expect_states or {}).get(job_id)
        if wanted and job["state"] != wanted:
            found.append(
                Violation(
                    "unexpected-state",
                    job_id,
                    f"ended {job['state']}, expected {wanted} (reason {job.get('state_reason')!r})",
                    runs,
                )
            )

    unknown = sorted({r.job_id for r in executions} - set(jobs))
    for job_id in unknown:
        found.append(
            Violation("unknown-job", job_id, "executed but not in the database", by_job[job_id])
        )

    per_gpu: dict[tuple[str, int], list[Execution]] = defaultdict(list)
    for run in executions:
        for gpu in run.gpus:
            per_gpu[(run.node, gpu)].append(run)
    for (node, gpu), runs in sorted(per_gpu.items()):
        for a, b in combinations(sorted(runs, key=lambda r: r.start), 2):
            both = _overlap(a, b, now)
            if both > 0:
                found.append(
                    Violation(
                        "gpu-double-booked",
                        None,
                        f"GPU {gpu} of {node} used by two executions for {both:.1f} s",
                        [a, b],
                    )
                )
    return found


@dataclass
class Report:
    fault: str
    jobs: Mapping[int, Mapping[str, Any]]
    executions: Sequence[Execution]
    violations: list[Violation]

    def summary(self) -> str:
        """The issue's table row: jobs, ran twice, double-booked GPUs, stuck."""
        twice = {
            v.job_id
            for v in self.violations
            if v.invariant in ("ran-concurrently", "ran-after-end", "rerun-after-completion")
        }
        gpus = {
            (r.node, g)
            for v in self.violations
            if v.invariant == "gpu-double-booked"
            for r in v.executions[:1]
            for g in r.gpus
        }
        stuck = {
            v.job_id
            for v in self.violations
            if v.invariant in ("not-terminal", "stuck-assigned", "stuck-running")
        }
        states: dict[str, int] = defaultdict(int)
        for job in self.jobs.values():
            states[job["state"]] += 1
        state_text = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        return (
            f"{self.fault}: {len(self.jobs)} jobs ({state_text}), {len(self.executions)} "
            f"executions; ran twice: {len(twice)}, GPUs double-booked: {len(gpus)}, "
            f"stuck: {len(stuck)}"
        )

    def text(self) -> str:
        lines = [self.summary()]
        order = sorted(self.violations, key=lambda v: (v.invariant, v.job_id or 0))
        lines += [v.describe() for v in order]
        return "\n".join(lines)


def invariants_hold(report: Report) -> None:
    """Raise AssertionError with the whole report when any invariant is violated."""
    if report.violations:
        raise AssertionError("invariants violated under fault " + report.text())


def count(violations: Iterable[Violation], invariant: str) -> int:
    return sum(1 for v in violations if v.invariant == invariant)
