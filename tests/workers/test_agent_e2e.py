"""The agent end to end: real agent processes on Redis, real job processes, the control
side's task functions applied in the test (see agent_harness)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psutil
import pytest
from django.core.cache import cache

from fleet.models import Gpu, Job, JobEvent, Node, TelemetryRollup, TelemetrySample
from fleet.services.jobs import job_cancel
from fleet.services.reaper import lost_after, nodes_reap
from fleet.services.telemetry import LATEST_KEY, telemetry_flush, telemetry_rollup
from scheduler.cycle.runner import run_cycle
from tests.factories import JobFactory
from tests.workers.agent_harness import ControlPump, dispatch
from tests.workers.conftest import StartAgent

pytestmark = pytest.mark.django_db


def state_is(job: Job, *states: str) -> Callable[[], Job | None]:
    def check() -> Job | None:
        current = Job.objects.get(pk=job.pk)
        return current if current.state in states else None

    return check


def group_pids(pgid: int | None) -> set[int]:
    """Live (non-zombie) processes of a process group."""
    pids = set()
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                pids.add(proc.pid)
        except (psutil.Error, ProcessLookupError):
            continue
    return pids


def test_job_that_prints_and_exits_0_succeeds_and_its_output_is_readable(
    agents: StartAgent, control: ControlPump, owner: Any, owner_api: Any, team: Any
) -> None:
    node, _ = agents()
    job = JobFactory(
        owner=owner, team=team, command="echo hello from fleet; echo attempt $FLEET_ATTEMPT"
    )
    dispatch(control, job, node)
    done = control.pump(state_is(job, "succeeded", "failed"), what="the job to end")
    assert done.state == "succeeded" and done.exit_code == 0, done.state_reason
    assert done.started_at is not None and done.finished_at is not None

    def log_complete() -> Any:
        body = owner_api.get(f"/api/v1/jobs/{job.pk}/logs/").json()
        return body if body["complete"] else None

    body = control.pump(log_complete, what="the log to be complete")
    assert body["data"] == "hello from fleet\nattempt 1\n"
    assert body["offset"] == 0 and body["next_offset"] == len(body["data"])
    tail = owner_api.get(f"/api/v1/jobs/{job.pk}/logs/?offset={body['next_offset']}").json()
    assert tail["data"] == "" and tail["complete"]


def test_exit_3_ends_failed_with_its_exit_code(
    agents: StartAgent, control: ControlPump, owner: Any, team: Any
) -> None:
    node, _ = agents()
    job = JobFactory(owner=owner, team=team, command="echo bad input >&2; exit 3")
    dispatch(control, job, node)
    done = control.pump(state_is(job, "succeeded", "failed"), what="the job to end")
    assert done.state == "failed"
    assert done.exit_code == 3
    assert "code 3" in done.state_reason


def test_job_past_its_time_limit_times_out_within_the_grace_and_leaves_no_process(
    agents: StartAgent, control: ControlPump, owner: Any, team: Any
) -> None:
    node, _ = agents()
    # Ignores SIGTERM (and so does its child): only the SIGKILL after the grace ends it.
    job = JobFactory(owner=owner, team=team, command="trap '' TERM; sleep 60", time_limit=1)
    dispatch(control, job, node)
    running = control.pump(state_is(job, "running"), what="the job to run")
    assert running.pid and group_pids(running.pid)
    # time limit 1 s + grace 2 s (FLEET_JOB_GRACE in the harness) + reporting slack
    done = control.pump(state_is(job, "timeout", "failed"), timeout=8, what="the timeout")
    assert done.state == "timeout"
    assert "time limit of 1 s" in done.state_reason
    assert group_pids(running.pid) == set()


def test_cancelling_a_running_job_kills_its_whole_process_group(
    agents: StartAgent, control: ControlPump, owner: Any, team: Any
) -> None:
    node, _ = agents()
    job = JobFactory(owner=owner, team=team, command="sleep 60 & sleep 60 & wait")
    dispatch(control, job, node)
    running = control.pump(state_is(job, "running"), what="the job to run")
    assert running.pid is not None

    def whole_group() -> set[int] | None:
        pids = group_pids(running.pid)  # the shell and its two sleeps
        return pids if len(pids) >= 3 else None

    pids = control.pump(whole_group, what="the job's processes")
    control.run(lambda: job_cancel(user=owner, job=running, reason="wrong data set"))
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    control.pump(
        lambda: not (group_pids(running.pid) & pids), timeout=8, what="the processes to go"
    )
    # The agent's own "cancelled" report arrives after the cancel: recorded, not applied.
    ignored = control.pump(
        lambda: JobEvent.objects.filter(job=job, applied=False, actor=node.name).first()
    )
    assert "already cancelled" in ignored.reason
    assert Job.objects.get(pk=job.pk).state_reason == "wrong data set"


def test_agent_killed_mid_job_its_lease_stops_the_job_then_it_completes_once_elsewhere(
    agents: StartAgent, control: ControlPump, owner: Any, team: Any, settings: Any
) -> None:
    settings.FLEET_LEASE_MARGIN_S = 1
    node_a, agent_a = agents(env={"FLEET_LEASE_S": "3"})
    node_b, _ = agents()
    job = JobFactory(
        owner=owner,
        team=team,
        command='echo on $FLEET_ATTEMPT; [ "$FLEET_ATTEMPT" = 1 ] && sleep 60; echo done',
        max_requeues=3,
    )
    dispatch(control, job, node_a)
    running = control.pump(state_is(job, "running"), what="the job to run on a")
    control.pump(lambda: Node.objects.get(pk=node_a.pk).lease_seconds == 3, what="a's lease")
    Node.objects.filter(pk=node_a.pk).update(heartbeat_timeout=2)
    agent_a.kill()  # kill -9 of the agent, mid-job
    node_a.refresh_from_db()
    last_a = node_a.last_heartbeat
    assert last_a is not None
    # b keeps beating after a died, so with the clock at a's deadlines only a is silent.
    control.pump(
        lambda: Node.objects.get(pk=node_b.pk).last_heartbeat > last_a + timedelta(seconds=1.5),
        what="b to beat after a died",
    )
    down = control.run(
        lambda: nodes_reap(now=last_a + timedelta(seconds=node_a.heartbeat_timeout + 1))
    )
    # Down, but its job may still run on a: it is not given up, so it cannot run twice.
    assert down["nodes_down"] == 1 and down["jobs_lost"] == 0
    assert Job.objects.get(pk=job.pk).state == "running"
    # With no agent to renew the lease, the job's shim stops it (lease 3 s + grace 2 s).
    deadline = time.monotonic() + 15
    while group_pids(running.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_pids(running.pid), "the job outlived its node's lease"
    summary = control.run(
        lambda: nodes_reap(now=last_a + lost_after(node_a) + timedelta(seconds=1))
    )
    assert summary["jobs_lost"] == 1
    assert Node.objects.get(pk=node_a.pk).state == "down"
    assert Node.objects.get(pk=node_b.pk).state == "up"
    requeued = Job.objects.get(pk=job.pk)
    assert (requeued.state, requeued.requeues, requeued.node_id) == ("pending", 1, None)

    # The scheduling cycle places it again: a is down, so on b.
    record = control.run(run_cycle)
    assert record is not None and record.placed == 1
    done = control.pump(state_is(job, "succeeded", "failed"), what="the job on b")
    assert done.state == "succeeded" and done.node_id == node_b.pk and done.attempt == 2
    applied = JobEvent.objects.filter(job=job, applied=True)
    assert [e.to_state for e in applied] == [
        "assigned", "running", "lost", "pending", "assigned", "running", "succeeded",
    ]  # fmt: skip


def test_simulated_telemetry_reaches_cache_history_and_rollups(
    agents: StartAgent, control: ControlPump, owner: Any, owner_api: Any, team: Any
) -> None:
    node, _ = agents(simulate="1xA100-80GB")
    gpu = Gpu.objects.get(node=node)
    job = JobFactory(owner=owner, team=team, command="sleep 30")
    dispatch(control, job, node)
    control.pump(state_is(job, "running"))

    def attributed() -> Any:
        latest = cache.get(LATEST_KEY.format(uuid=gpu.uuid))
        if latest and any(p["job_id"] == job.pk for p in latest["processes"]):
            return latest
        return None

    latest = control.pump(attributed, what="a sample attributing the GPU to the job")
    assert latest["util_percent"] > 50  # the simulated job's default load
    assert latest["backend"] == "simulated"
    node_view = owner_api.get(f"/api/v1/nodes/{node.name}/").json()
    shown = node_view["gpus"][0]["latest"]
    assert shown["memory_total_mb"] == 81920 and shown["memory_used_mb"] > 0

    def two_stored() -> bool:
        telemetry_flush()
        return TelemetrySample.objects.filter(gpu=gpu).count() >= 2

    # Readings sent before the node registered its GPUs are refused: wait for a second one.
    control.pump(two_stored, what="two samples in the history")

    first = TelemetrySample.objects.filter(gpu=gpu).earliest("sampled_at").sampled_at
    telemetry_rollup(now=first + timedelta(minutes=2))
    rollup = TelemetryRollup.objects.get(gpu=gpu, minute=first.replace(second=0, microsecond=0))
    assert rollup.samples >= 1 and rollup.util_percent is not None
