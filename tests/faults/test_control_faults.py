"""Faults of the control side and of the messages between it and the agents (issue 10's
table): the control worker killed mid-burst or with a report in flight, two reports of one
attempt applied at once, a heartbeat delivered late, a cancel while the start waits at the
agent. Each test asserts from the jobs' execution log."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from tests.faults.servers import wait_for
from tests.faults.stack import Stack

pytestmark = pytest.mark.faults


def lock_waiters(stack: Stack, query_like: str = "%") -> int:
    """Backends of the test's database waiting for a lock (a row lock included) while
    running a statement like `query_like`."""
    with stack.pg.connect(stack.database) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            [stack.database, query_like],
        ).fetchone()
    return int(row[0]) if row else 0


# Held on job rows, this blocks the state machine's UPDATE but not the key-share locks of
# inserts that point at the job (its events, its log chunks).
HOLD_JOBS = "SELECT id FROM fleet_job WHERE id = ANY(%s) FOR NO KEY UPDATE"
JOB_UPDATE = 'UPDATE "fleet_job" SET%'


def test_control_worker_kill9_right_after_a_burst_of_submits(stack: Stack) -> None:
    """The control worker dies (kill -9, pool and all) while it dispatches a burst: some
    dispatches are committed and their start messages may never leave. Nothing may stay
    assigned with its GPUs idle, nothing may run twice."""
    stack.start()
    ids: list[int] = []
    for _ in range(2):
        ids += stack.submit(12, seconds=2)
        time.sleep(0.3)
        stack.control.kill9()
        time.sleep(1)
        stack.control.start()
    stack.assert_invariants(
        "control worker kill -9 after a burst of submits",
        settle_s=120,
        expect_states=stack.all_succeed(ids),
    )


def test_control_worker_kill9_with_a_report_in_flight(stack: Stack) -> None:
    """The control worker has taken success reports from the broker and dies (kill -9)
    before applying them. The reports must be applied all the same (redelivered soon, or
    repeated by the agents), not taken for lost jobs that then run again."""
    stack.start()
    ids = stack.submit(4, seconds=3)
    stack.wait_executions(4)
    # Hold the job rows, so the worker that takes a report waits inside its transaction.
    holder = stack.pg.connect(stack.database, autocommit=False)
    try:
        holder.execute("SELECT id FROM fleet_job WHERE id = ANY(%s) FOR UPDATE", [ids])
        wait_for(lambda: sum(r.completed for r in stack.executions()) >= 4, 15, "the 4 jobs ending")
        wait_for(lambda: lock_waiters(stack) >= 1, 10, "a report waiting on the job rows")
        time.sleep(0.5)
        stack.control.kill9()
    finally:
        holder.rollback()
        holder.close()
    time.sleep(1)
    stack.control.start()
    stack.assert_invariants(
        "control worker kill -9 with a report in flight",
        settle_s=120,
        expect_states=stack.all_succeed(ids),
    )


def test_running_and_succeeded_reports_applied_at_the_same_moment(stack: Stack) -> None:
    """A job that ends at once: its "running" and its "succeeded" report are applied by
    the control worker's two processes at the same moment (both wait on the job's row,
    then race). The success must not be lost to the conflict."""
    stack.start()
    ids = []
    for _ in range(3):
        for node in ("sim-a", "sim-b"):
            stack.agent(node).freeze()  # the start waits until the row is held
        (job_id,) = stack.submit(1, seconds=0)
        ids.append(job_id)
        stack.wait_jobs(lambda jobs, j=job_id: jobs[j]["state"] == "assigned", 3, "dispatch")
        holder = stack.pg.connect(stack.database, autocommit=False)
        try:
            holder.execute(HOLD_JOBS, [[job_id]])
            for node in ("sim-a", "sim-b"):
                stack.agent(node).thaw()
            wait_for(
                lambda j=job_id: any(r.job_id == j and r.completed for r in stack.executions()),
                10,
                f"job {job_id} ending",
            )
            try:  # the success (applied as start then succeed) and the running report wait
                wait_for(
                    lambda: (
                        lock_waiters(stack, JOB_UPDATE) >= 2
                        and lock_waiters(stack, "%start report came later%") >= 1
                    ),
                    6,
                    "both reports waiting",
                )
            except TimeoutError:
                pass  # the reports were applied otherwise; they may race all the same
        finally:
            holder.commit()
            holder.close()
        time.sleep(1)
    stack.assert_invariants(
        "a running and a succeeded report at the same moment",
        settle_s=60,
        expect_states=stack.all_succeed(ids),
    )


def _held_heartbeats(stack: Stack, node: str) -> list[bytes]:
    """Take `node`'s queued heartbeats that list no job out of the control queue (the
    control worker is frozen meanwhile), to deliver them late."""
    client = stack.redis.client()
    taken = []
    for raw in client.lrange("control", 0, -1):
        message = json.loads(raw)
        if message.get("headers", {}).get("task") != "fleet.tasks.agent_heartbeat":
            continue
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        _args, kwargs, _embed = json.loads(body)
        envelope: dict[str, Any] = json.loads(kwargs["m"])
        if envelope["node"] == node and not envelope["args"].get("running"):
            if client.lrem("control", 1, raw):
                taken.append(raw)
    return taken


def test_late_heartbeat_that_does_not_list_a_running_job(stack: Stack) -> None:
    """Heartbeats sent before the jobs started are delivered after they run (real
    messages, signed by the agent, held back in the broker): a job they do not list must
    not be taken for lost, now or by a later heartbeat."""
    stack.start()
    stack.control.freeze()
    time.sleep(1.5)  # both agents send heartbeats that list nothing
    held = {node: _held_heartbeats(stack, node) for node in ("sim-a", "sim-b")}
    stack.control.thaw()
    assert all(len(h) >= 2 for h in held.values()), f"held heartbeats: {held}"
    ids = stack.submit(4, seconds=12)
    stack.wait_executions(4)
    client = stack.redis.client()
    for round_ in range(2):
        for node in held:
            client.lpush("control", held[node][round_])
        time.sleep(4)  # longer than FLEET_MISSING_GRACE between the two late heartbeats
    stack.assert_invariants(
        "a late heartbeat that does not list a job",
        settle_s=60,
        expect_states=stack.all_succeed(ids),
    )


def test_cancel_while_the_start_is_queued_at_the_agent(stack: Stack) -> None:
    """The jobs are dispatched, their starts wait in the agents' queues (agents frozen),
    and the jobs are cancelled: a cancelled job's command must never run."""
    stack.start()
    for node in ("sim-a", "sim-b"):
        stack.agent(node).freeze()
    ids = stack.submit(2, seconds=3)
    stack.wait_jobs(
        lambda jobs: all(jobs[i]["state"] == "assigned" for i in ids), 3, "both dispatched"
    )
    for job_id in ids:
        assert stack.cancel(job_id)["state"] == "cancelled"
    time.sleep(1)  # what starts from now on started after the cancel
    for node in ("sim-a", "sim-b"):
        stack.agent(node).thaw()
    time.sleep(3)
    report = stack.assert_invariants(
        "cancel while the start is queued at the agent",
        settle_s=30,
        expect_states={i: "cancelled" for i in ids},
    )
    assert not report.executions, "a cancelled job's command ran"
