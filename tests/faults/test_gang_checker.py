"""The invariant check on made-up histories of multi-node jobs: the members of one attempt
run together, one per node; a member of an old attempt beside a new one, a member left
running, or a success with a member that never completed are each named."""

from __future__ import annotations

from typing import Any

import pytest

from tests.faults.executions import Execution
from tests.faults.invariants import check, count

pytestmark = pytest.mark.faults


def run(start: float, end: float | None, *, node: str, attempt: int = 1,
        how: str | None = "end", alive: bool = False) -> Execution:  # fmt: skip
    return Execution(
        node=node,
        pid=int(start * 1000) + attempt,
        job_id=1,
        attempt=attempt,
        gpus=(0, 1, 2),
        start=start,
        last_seen=end if end is not None else start,
        ended=how if end is not None else None,
        end=end,
        alive=alive,
    )


def gang(state: str = "succeeded", attempt: int = 1) -> dict[int, dict[str, Any]]:
    members = [
        {"rank": 0, "node": "a", "state": "running"},
        {"rank": 1, "node": "b", "state": "running"},
    ]
    return {
        1: {
            "state": state,
            "attempt": attempt,
            "node": "a",
            "nodes": 2,
            "members": members,
            "state_reason": "",
        }  # fmt: skip
    }


def kinds(runs: list[Execution], jobs: dict[int, dict[str, Any]]) -> list[str]:
    return sorted(v.invariant for v in check(executions=runs, jobs=jobs, events={}, now=1000.0))


def test_members_of_one_attempt_run_together() -> None:
    runs = [run(10, 30, node="a"), run(10.2, 30.1, node="b")]
    assert kinds(runs, gang()) == []


def test_a_requeued_gang_after_its_old_members_ended() -> None:
    runs = [
        run(10, 19, node="a", how="term"),
        run(10, 15, node="b", how="term"),
        run(20, 40, node="a", attempt=2),
        run(20, 40, node="b", attempt=2),
    ]
    assert kinds(runs, gang(attempt=2)) == []


def test_an_old_member_beside_the_new_attempt() -> None:
    runs = [
        run(10, 25, node="b", how="term"),  # the old member on b outlived the requeue
        run(10, 15, node="a", how="term"),
        run(20, 40, node="a", attempt=2),
        run(20, 40, node="b", attempt=2),
    ]
    found = check(executions=runs, jobs=gang(attempt=2), events={}, now=1000.0)
    # Beside both new members, and on b's GPUs.
    assert count(found, "ran-concurrently") == 2
    assert {v.executions[0].node for v in found if v.invariant == "gpu-double-booked"} == {"b"}
    assert any("attempt 1 ran beside attempt 2" in v.detail for v in found)


def test_two_executions_of_one_member() -> None:
    runs = [run(10, 30, node="a"), run(12, 30, node="a"), run(10, 30, node="b")]
    assert "ran-concurrently" in kinds(runs, gang())


def test_a_member_left_running_alone() -> None:
    runs = [run(10, 15, node="a", how="term"), run(10, None, node="b", alive=True)]
    assert kinds(runs, gang(state="failed")) == ["runs-unaccounted"]


def test_succeeded_with_a_member_that_never_completed() -> None:
    runs = [run(10, 30, node="a"), run(10, 20, node="b", how="term")]
    found = check(executions=runs, jobs=gang(), events={}, now=1000.0)
    assert [v.invariant for v in found] == ["succeeded-without-execution"]
    assert "on b" in found[0].detail


def test_a_single_node_job_is_checked_as_before() -> None:
    jobs = {1: {"state": "succeeded", "attempt": 1, "node": "a", "state_reason": ""}}
    runs = [run(10, 30, node="a"), run(10, 30, node="b")]
    assert "ran-concurrently" in kinds(runs, jobs)
