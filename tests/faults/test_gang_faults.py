"""Faults of a multi-node job (a gang, docs/gangs.md): the agent of one member dies. The
gang must stop and requeue as one (its other member stopped, one new attempt), no member
of the old attempt may run beside the new one, stale and repeated member reports must
change nothing, and every GPU, CPU core and MB of memory must be free again at the end."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.faults.servers import wait_for
from tests.faults.stack import LOST_AFTER_S, Stack

pytestmark = pytest.mark.faults

NODES = {"sim-a", "sim-b"}
# How long the scheduler gets to place the gang before the test places it by hand.
POLICY_WAIT_S = 15.0
RENDEZVOUS_VARS = (
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_WORLD_SIZE",
    "FLEET_NNODES", "FLEET_NODE_RANK", "FLEET_NODELIST",
)  # fmt: skip


def rendezvous(stack: Stack, job_id: int, rank: int, attempt: int) -> dict[str, str]:
    """The rendezvous variables a member printed, read from its stored log."""

    def printed() -> dict[str, str] | None:
        text = stack.logs(job_id, rank=rank, attempt=attempt)
        seen = dict(re.findall(r"^([A-Z_]+)=(.*)$", text, re.MULTILINE))
        return seen if all(name in seen for name in RENDEZVOUS_VARS) else None

    return dict(wait_for(printed, 30, f"rank {rank}'s environment in its stored log", 0.5))


def placed(stack: Stack, job_id: int, attempt: int, timeout: float = 60) -> None:
    """Wait for the scheduler to dispatch `attempt` of the gang. Where no policy has placed
    it within POLICY_WAIT_S (a tree whose policies do not place multi-node jobs), dispatch
    it through the production apply step by hand, rank 0 on sim-a, and say so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = job_row(stack, job_id)
        if job["attempt"] >= attempt:
            return
        waited = time.monotonic() - (deadline - timeout)
        if job["state"] == "pending" and waited > POLICY_WAIT_S and stack.nodes_up(NODES):
            if stack.place_by_hand(job_id, ("sim-a", (0, 1, 2)), ("sim-b", (0, 1, 2))):
                print(f"attempt {attempt} placed by hand: no policy placed it in {waited:.0f} s")
                return
        time.sleep(0.5)
    raise AssertionError(f"attempt {attempt} of job {job_id} was not dispatched in {timeout} s")


def job_row(stack: Stack, job_id: int) -> dict[str, Any]:
    return stack.jobs()[job_id]


def used(stack: Stack) -> dict[str, dict[str, int]]:
    return {name: node["used"] for name, node in stack.nodes().items()}


@pytest.mark.parametrize("victim_rank", [1, 0], ids=["rank-1", "rank-0"])
def test_gang_member_agent_kill9(stack: Stack, victim_rank: int) -> None:
    """kill -9 of the agent of one member (rank 1, or rank 0, the one other members connect
    to) while the gang runs; the agent comes back after the gang went back to the queue."""
    stack.start(simulate="4xA100-80GB")
    idle = used(stack)
    assert all(u == {"gpus": 0, "cpus": 0, "memory_mb": 0} for u in idle.values()), idle
    printenv = "env | grep -E '^(MASTER_|WORLD_SIZE|NODE_RANK|LOCAL_WORLD|FLEET_N)' | sort; "
    # The command prints the rendezvous first, then runs the recording job script.
    (job_id,) = stack.submit(
        1,
        seconds=25,
        gpus=6,
        gpus_per_node=3,
        cpus=1,
        memory_mb=256,
        max_requeues=3,
        command=printenv + stack.log.command(25),
    )
    placed(stack, job_id, 1)
    first = stack.wait_executions(2, timeout=60)
    first = [r for r in first if r.job_id == job_id]
    job = stack.wait_jobs(lambda jobs: jobs[job_id]["state"] == "running", 30, "the gang running")[
        job_id
    ]
    assert job["attempt"] == 1, job
    members = {m["rank"]: m for m in job["members"]}
    assert sorted(members) == [0, 1] and {m["node"] for m in members.values()} == {
        "sim-a",
        "sim-b",
    }
    assert all(len(m["gpu_indices"]) == 3 for m in members.values())
    # Each member runs on its own node with its own three GPUs.
    assert {(r.node, r.gpus) for r in first} == {
        (m["node"], tuple(m["gpu_indices"])) for m in members.values()
    }
    busy = used(stack)
    assert all(u == {"gpus": 3, "cpus": 1, "memory_mb": 256} for u in busy.values()), busy

    master = stack.nodes()[members[0]["node"]]["address"]
    envs = {rank: rendezvous(stack, job_id, rank, 1) for rank in (0, 1)}
    for rank, env in envs.items():
        assert env["MASTER_ADDR"] == master, env
        assert env["WORLD_SIZE"] == "6" and env["LOCAL_WORLD_SIZE"] == "3", env
        assert env["NODE_RANK"] == env["FLEET_NODE_RANK"] == str(rank), env
        assert env["FLEET_NNODES"] == "2", env
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert envs[0]["FLEET_NODELIST"] == envs[1]["FLEET_NODELIST"]

    victim, survivor = members[victim_rank]["node"], members[1 - victim_rank]["node"]
    stack.agent(victim).kill9()

    # The survivor's member is stopped (it got SIGTERM) and the gang goes back to the queue.
    def survivor_stopped() -> bool:
        runs = [r for r in stack.executions() if r.job_id == job_id and r.attempt == 1]
        return any(r.node == survivor and r.ended == "term" for r in runs)

    wait_for(survivor_stopped, LOST_AFTER_S + 20, f"the member on {survivor} stopped", 0.3)
    stack.wait_jobs(
        lambda jobs: jobs[job_id]["state"] == "pending" and jobs[job_id]["requeues"] == 1,
        30,
        "the gang requeued",
    )
    stack.agent(victim).start()
    placed(stack, job_id, 2)
    stack.wait_jobs(
        lambda jobs: jobs[job_id]["state"] == "running" and jobs[job_id]["attempt"] == 2,
        60,
        "the gang's second attempt running",
    )
    second = stack.wait_executions(2, live=True, timeout=30)
    assert {r.attempt for r in second if r.job_id == job_id} == {2}

    # Stale and repeated member reports: attempt 1's late start from the node whose agent
    # died, attempt 1's failure again from the survivor, attempt 2's start twice.
    events_before = len(stack.events(job_id))
    stack.send_report(victim, job_id=job_id, attempt=1, state="running", pid=4242)
    stack.send_report(survivor, job_id=job_id, attempt=1, state="failed", exit_code=1)
    stack.send_report(survivor, job_id=job_id, attempt=2, state="running", pid=4343)
    stack.send_report(survivor, job_id=job_id, attempt=2, state="running", pid=4343)

    def recorded() -> list[dict[str, Any]] | None:
        events = stack.events(job_id)[events_before:]
        return events if len(events) >= 3 else None

    late = wait_for(recorded, 30, "the stale reports recorded", 0.3)
    assert not any(e["applied"] and e["attempt"] == 1 for e in late), late
    job = job_row(stack, job_id)
    assert job["state"] == "running" and job["attempt"] == 2 and job["requeues"] == 1, job
    assert {m["state"] for m in job["members"]} == {"running"}, job["members"]

    report = stack.assert_invariants(
        f"the agent of a gang's rank {victim_rank} killed -9",
        settle_s=150,
        expect_states={job_id: "succeeded"},
    )
    runs = [r for r in report.executions if r.job_id == job_id]
    # One new attempt, on both nodes; every execution of attempt 1 ended before it began.
    assert sorted((r.attempt, r.node) for r in runs if r.attempt == 2) == [
        (2, "sim-a"),
        (2, "sim-b"),
    ]
    assert report.jobs[job_id]["attempt"] == 2
    assert {r.node: r.ended for r in runs if r.attempt == 1}[survivor] == "term"
    assert not any(r.alive for r in stack.executions())
    wait_for(lambda: used(stack) == idle, 20, "every GPU, CPU and MB free again", 0.5)
