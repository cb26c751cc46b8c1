"""The harness itself: with no fault, every job runs once, and the checks find nothing."""

from __future__ import annotations

import pytest

from tests.faults.stack import Stack

pytestmark = pytest.mark.faults


def test_no_fault_every_job_runs_once(stack: Stack) -> None:
    stack.start()
    ids = stack.submit(8, seconds=2)
    report = stack.assert_invariants("no fault", expect_states=stack.all_succeed(ids))
    runs = report.executions
    assert sorted(r.job_id for r in runs) == sorted(ids), "each job ran exactly once"
    assert {r.node for r in runs} == {"sim-a", "sim-b"}, "both agents ran jobs"
    assert all(len(r.gpus) == 1 for r in runs)
