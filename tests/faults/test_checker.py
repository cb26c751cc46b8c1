"""The invariant check on made-up histories: it names each violation, and passes a clean
history (so a fault test that passes means something)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.faults.executions import Execution, ExecutionLog
from tests.faults.invariants import Report, check

pytestmark = pytest.mark.faults


def run(job: int, start: float, end: float | None, *, node: str = "a", gpu: int = 0,
        attempt: int = 1, how: str | None = "end", last: float | None = None,
        alive: bool = False) -> Execution:  # fmt: skip
    return Execution(
        node=node,
        pid=int(start * 1000) + job,
        job_id=job,
        attempt=attempt,
        gpus=(gpu,),
        start=start,
        last_seen=end if end is not None else (last if last is not None else start),
        ended=how if end is not None else None,
        end=end,
        alive=alive,
    )


def job(state: str = "succeeded", attempt: int = 1, node: str | None = "a") -> dict[str, Any]:
    return {"state": state, "attempt": attempt, "node": node, "state_reason": ""}


def at(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def ended(state: str, t: float) -> list[dict[str, Any]]:
    return [{"to_state": state, "at": at(t), "applied": True}]


def kinds(**kw: Any) -> list[str]:
    kw.setdefault("now", 1000.0)
    return sorted(v.invariant for v in check(**kw))


def test_a_clean_history_passes() -> None:
    runs = [run(1, 10, 13, gpu=0), run(2, 10, 12, gpu=1), run(3, 13.5, 16, gpu=0)]
    jobs = {1: job(), 2: job(), 3: job()}
    events = {1: ended("succeeded", 13.2), 2: ended("succeeded", 12.1), 3: ended("succeeded", 16.3)}
    assert kinds(executions=runs, jobs=jobs, events=events) == []


def test_two_executions_of_one_job_at_once() -> None:
    runs = [run(1, 10, 20, node="a"), run(1, 15, 25, node="b", attempt=2)]
    found = check(executions=runs, jobs={1: job(attempt=2, node="b")},
                  events={1: ended("succeeded", 25.5)}, now=100)  # fmt: skip
    names = sorted(v.invariant for v in found)
    assert "ran-concurrently" in names
    assert "rerun-after-completion" not in names  # the second started before the first ended
    concurrent = next(v for v in found if v.invariant == "ran-concurrently")
    assert "5.0 s" in concurrent.detail and len(concurrent.executions) == 2


def test_a_run_after_success() -> None:
    runs = [run(1, 10, 12), run(1, 20, 22, attempt=2, gpu=1)]
    found = kinds(executions=runs, jobs={1: job(attempt=1)}, events={1: ended("succeeded", 12.5)})
    assert found == ["ran-after-end", "rerun-after-completion"]


def test_a_rerun_after_completion_is_allowed_only_when_said() -> None:
    runs = [run(1, 10, 12), run(1, 20, 22, attempt=2)]
    jobs = {1: job(attempt=2)}
    events = {1: ended("succeeded", 22.5)}
    assert kinds(executions=runs, jobs=jobs, events=events) == ["rerun-after-completion"]
    assert kinds(executions=runs, jobs=jobs, events=events, allow_rerun_after_completion=True) == []


def test_a_cancelled_job_that_starts_later() -> None:
    runs = [run(1, 20, 22)]
    found = kinds(executions=runs, jobs={1: job("cancelled")}, events={1: ended("cancelled", 10)})
    assert found == ["ran-after-end"]


def test_succeeded_without_a_completed_execution() -> None:
    killed = run(1, 10, None, last=14)  # SIGKILL: no end line
    found = kinds(executions=[killed], jobs={1: job()}, events={1: ended("succeeded", 20)})
    assert found == ["succeeded-without-execution"]
    assert kinds(executions=[], jobs={1: job()}, events={}) == ["succeeded-without-execution"]


def test_one_gpu_used_by_two_jobs() -> None:
    runs = [run(1, 10, 20, gpu=1), run(2, 18, 30, gpu=1), run(3, 18, 30, gpu=0)]
    jobs = {1: job(), 2: job(), 3: job()}
    events = {i: ended("succeeded", 31) for i in jobs}
    found = check(executions=runs, jobs=jobs, events=events, now=100)
    assert [v.invariant for v in found] == ["gpu-double-booked"]
    assert "GPU 1 of a" in found[0].detail
    # The same index on another node is another GPU.
    runs = [run(1, 10, 20, gpu=1, node="a"), run(2, 18, 30, gpu=1, node="b")]
    assert kinds(executions=runs, jobs=jobs | {3: job("cancelled")}, events=events) == []


def test_a_killed_execution_counts_until_its_last_line() -> None:
    killed = run(1, 10, None, last=15)
    later = run(2, 15.5, 20)
    jobs = {1: job("failed"), 2: job()}
    events = {1: ended("failed", 16), 2: ended("succeeded", 21)}
    assert kinds(executions=[killed, later], jobs=jobs, events=events) == []
    alive = run(1, 10, None, last=15, alive=True)
    found = kinds(executions=[alive, later], jobs=jobs, events=events)
    assert "gpu-double-booked" in found and "runs-unaccounted" in found


def test_stuck_jobs_and_unexpected_ends() -> None:
    runs = [run(1, 10, None, last=12)]
    found = check(executions=runs, jobs={1: job("running"), 2: job("pending", 0, None)},
                  events={}, now=100, expect_states={2: "succeeded"})  # fmt: skip
    names = sorted(v.invariant for v in found)
    assert names == ["not-terminal", "not-terminal", "unexpected-state"]
    report = Report("test", {1: job("running"), 2: job("pending")}, runs, found)
    assert "stuck: 2" in report.summary()


def test_the_log_is_read_back(tmp_path: Path) -> None:
    log = ExecutionLog(tmp_path / "x")
    log.path.write_text(
        "start 10.0 a 1 1 0 100\ntick 11.0 a 1 1 0 100\nend 12.0 a 1 1 0 100\n"
        "start 10.5 b 2 3 0,1 100\ntick 11.5 b 2 3 0,1 100\nterm 11.7 b 2 3 0,1 100\n"
        "tick 11.9 b 2 3 0,1 100\nexit 12.2 b 2 3 0,1 100\n"
        "start 13.0 a 3 1 none 101\ntick 14.0 a 3 1 none 101\ngarbage\n"
    )
    runs = log.read()
    assert [(r.node, r.job_id, r.attempt, r.gpus, r.ended) for r in runs] == [
        ("a", 1, 1, (0,), "end"),
        ("b", 2, 3, (0, 1), "term"),
        ("a", 3, 1, (), None),
    ]
    assert runs[2].until(now=99) == 14.0 and runs[1].until(now=99) == 12.2
    assert runs[0].completed and not runs[1].completed and runs[1].end == 12.2
    assert "exec sh " in log.command(3) and log.command(3).endswith(" 3")


def test_an_execution_stopped_between_its_end_and_its_exit_has_not_completed(
    tmp_path: Path,
) -> None:
    """The node's lease ran out the moment the job wrote its end line: SIGTERM reached it
    before it exited, so it exited 143 and its node reported it stopped. Running it again
    is what should happen, not a rerun of a finished job."""
    log = ExecutionLog(tmp_path / "x")
    log.path.write_text(
        "start 10.0 b 3 1 0 200\nend 13.1 b 3 1 0 200\nterm 13.11 b 3 1 0 200\n"
        "tick 13.4 b 3 1 0 200\nexit 13.6 b 3 1 0 200\n"
        "start 40.0 b 3 2 0 300\nend 43.0 b 3 2 0 300\n"
    )
    first, second = log.read()
    assert not first.completed and first.stopped_after_end and second.completed
    assert "exit 143" in first.describe()
    found = kinds(executions=[first, second], jobs={3: job(attempt=2, node="b")},
                  events={3: ended("succeeded", 43.5)})  # fmt: skip
    assert found == []
    # Without the SIGTERM it had completed, and the second run is a violation.
    log.path.write_text(
        "start 10.0 b 3 1 0 200\nend 13.1 b 3 1 0 200\n"
        "start 40.0 b 3 2 0 300\nend 43.0 b 3 2 0 300\n"
    )
    found = kinds(executions=log.read(), jobs={3: job(attempt=2, node="b")},
                  events={3: ended("succeeded", 43.5)})  # fmt: skip
    assert found == ["rerun-after-completion"]
