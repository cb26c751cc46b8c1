"""Faults of a GPU host's agent (issue 10's table): killed, restarted, frozen, cut off
from the broker. Each test asserts from the jobs' execution log that no job ran twice at
once or again after it finished, no GPU was shared, and nothing was left stuck."""

from __future__ import annotations

import time

import pytest

from tests.faults.servers import wait_for
from tests.faults.stack import LOST_AFTER_S, Stack

pytestmark = pytest.mark.faults


def busiest_node(stack: Stack, count: int = 1, timeout: float = 30) -> str:
    """The node running the most executions, once some node runs `count`."""

    def pick() -> str | None:
        live = [r for r in stack.executions() if r.alive]
        nodes = {r.node for r in live}
        best = max(nodes, key=lambda n: sum(r.node == n for r in live), default=None)
        if best is None or sum(r.node == best for r in live) < count:
            return None
        return best

    return str(wait_for(pick, timeout, f"a node running {count} executions", 0.2))


def test_agent_kill9_then_restarted(stack: Stack) -> None:
    """The agent dies (kill -9) while its jobs run; they finish while it is away, and it
    comes back: their outcomes must reach the control side, none may run again."""
    stack.start()
    ids = stack.submit(12, seconds=3)
    victim = busiest_node(stack, 2)
    stack.agent(victim).kill9()
    time.sleep(4)  # past the node's heartbeat timeout; its orphans end meanwhile
    stack.agent(victim).start()
    stack.assert_invariants("agent kill -9, restarted", expect_states=stack.all_succeed(ids))


def test_agent_kill9_stays_down(stack: Stack) -> None:
    """The agent dies for good while its jobs run, and nothing on that host stops them:
    the jobs may run again elsewhere only once the old processes are surely gone."""
    stack.start()
    ids = stack.submit(2, seconds=15)
    victim = busiest_node(stack, 1)
    stack.agent(victim).kill9()
    stack.assert_invariants(
        "agent kill -9, stays down", settle_s=120, expect_states=stack.all_succeed(ids)
    )


def test_agent_kill9_while_starting_jobs_stays_down(stack: Stack) -> None:
    """The agent dies (kill -9) in the middle of starting jobs and stays down: a job it had
    begun to launch must be stopped by its lease like any other before it runs elsewhere."""
    stack.start()
    victim = "sim-a"
    stack.agent(victim).freeze()
    ids = stack.submit(3, seconds=20)
    stack.wait_jobs(
        lambda jobs: any(j["node"] == victim for j in jobs.values()), 3, f"a job sent to {victim}"
    )
    stack.agent(victim).thaw()
    time.sleep(0.15)  # it is now taking the start: checking it, launching the job
    stack.agent(victim).kill9()
    stack.assert_invariants(
        "agent kill -9 while starting jobs, stays down",
        settle_s=120,
        expect_states=stack.all_succeed(ids),
    )


def test_agent_restarted_while_its_orphans_run(stack: Stack) -> None:
    """The agent dies, the node is declared down, the agent comes back while its old job
    processes still run: those GPUs must not be given to other jobs meanwhile, and the
    jobs must not run twice."""
    stack.start()
    ids = stack.submit(4, seconds=20)  # every GPU busy: the victim's GPUs are the free ones
    stack.wait_executions(4)
    victim = "sim-a"
    stack.agent(victim).kill9()
    wait_for(lambda: stack.nodes()[victim]["state"] == "down", 15, f"{victim} declared down")
    time.sleep(1)
    stack.agent(victim).start()
    ids += stack.submit(2, seconds=5)  # more work that would take the orphans' GPUs
    stack.assert_invariants(
        "agent restarted while its orphans still run",
        settle_s=120,
        expect_states=stack.all_succeed(ids),
    )


def test_agent_killed_with_starts_queued_restarted_after_node_down(stack: Stack) -> None:
    """Starts wait in the agent's queue when it is killed; the node is declared down and
    its jobs go elsewhere; then the agent comes back and finds those old starts. The start
    timeout is long here, so only fencing (not the start's expiry) can refuse them."""
    stack.env_overrides["FLEET_START_TIMEOUT"] = "60"
    stack.start()
    victim = "sim-a"
    stack.agent(victim).freeze()  # the starts queue up unconsumed
    ids = stack.submit(4, seconds=8)
    jobs = stack.wait_jobs(
        lambda jobs: any(j["node"] == victim for j in jobs.values()),
        3,
        f"a job dispatched to {victim} before it is declared down",
    )
    stack.agent(victim).kill9()
    stale = {i for i, j in jobs.items() if j["node"] == victim}
    stack.wait_jobs(
        lambda jobs: all(jobs[i]["attempt"] > 1 and jobs[i]["node"] != victim for i in stale),
        LOST_AFTER_S + 30,
        f"jobs {sorted(stale)} of {victim} dispatched again elsewhere",
    )
    stack.agent(victim).start()
    stack.assert_invariants(
        "agent killed with starts queued, restarted after the node was declared down",
        settle_s=120,
        expect_states=stack.all_succeed(ids),
    )


@pytest.mark.parametrize("frozen_s", [5, 15], ids=["within-lease", "past-lease"])
def test_agent_sigstop_past_node_timeout(stack: Stack, frozen_s: int) -> None:
    """The agent freezes (SIGSTOP) past its node's heartbeat timeout (5 s: within the
    lease; 15 s: past the lease and the control side's margin), then resumes (SIGCONT)."""
    stack.start()
    ids = stack.submit(2, seconds=15)
    victim = busiest_node(stack, 1)
    stack.agent(victim).freeze()
    time.sleep(frozen_s)
    stack.agent(victim).thaw()
    stack.assert_invariants(
        f"agent SIGSTOP {frozen_s} s, then SIGCONT",
        settle_s=120,
        allow_rerun_after_completion=frozen_s > 6,
        expect_states=stack.all_succeed(ids),
    )


@pytest.mark.parametrize("mode", ["blackhole", "reset"])
def test_agent_partitioned_from_the_broker(stack: Stack, mode: str) -> None:
    """The agent's connection to Redis is cut for longer than the lease and its margin
    (blackhole: nothing passes, then everything that waited arrives; reset: connections
    refused). Its jobs must be stopped before they run elsewhere. A job that finished
    during the partition may run again (sequentially) by design: its outcome could not be
    told in time."""
    stack.start(proxied=("sim-a", "sim-b"))
    ids = stack.submit(2, seconds=20)
    victim = busiest_node(stack, 1)
    stack.proxies[victim].cut(mode)
    time.sleep(LOST_AFTER_S + 4)
    stack.proxies[victim].heal()
    stack.assert_invariants(
        f"agent partitioned from the broker ({mode}) for {LOST_AFTER_S + 4} s",
        settle_s=120,
        allow_rerun_after_completion=True,
        expect_states=stack.all_succeed(ids),
    )
