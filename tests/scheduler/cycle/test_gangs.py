"""Multi-node jobs through the production cycle: a gang placement is booked whole with one
member per node and one signed start each; the job runs when every member has started,
succeeds when every member has, and ends or goes back to the queue as one when any member
fails, is lost or its node goes down, every other member stopped on its node."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleet.models import GpuRelease, Job, JobEvent, JobMember, JobState, Node
from fleet.services import messaging
from fleet.services.agents import agent_heartbeat
from fleet.services.job_reports import job_report_apply
from fleet.services.jobs import job_cancel
from fleet.services.reaper import nodes_reap
from scheduler.core.model import Member, Place, Plan
from scheduler.cycle.apply import apply_plan
from scheduler.cycle.snapshot import build_snapshot
from tests.scheduler.cycle.conftest import make_job, make_node
from workers.executor.spec import spec_from_start

# Real commits: starts and stops leave on commit, as in production.
pytestmark = pytest.mark.django_db(transaction=True)

START, STOP = messaging.START_JOB_TASK, messaging.STOP_JOB_TASK


def host_node(
    name: str, address: str, *, gpus: int = 4, cpus: int = 32, memory_mb: int = 65536
) -> Node:
    node = make_node(name, gpus)
    Node.objects.filter(pk=node.pk).update(
        cpus=cpus, memory_mb=memory_mb, address=address, last_heartbeat=timezone.now()
    )
    return Node.objects.get(pk=node.pk)


@pytest.fixture
def nodes(db: Any) -> list[Node]:
    return [
        host_node("sim-a", "10.0.0.1"),
        host_node("sim-b", "10.0.0.2"),
        host_node("sim-c", "10.0.0.3"),
    ]


def gang(owner: Any, team: Any, **fields: Any) -> Job:
    fields = {"gpus": 8, "gpus_per_node": 4, "cpus": 8, "memory_mb": 16384, **fields}
    return make_job(owner, team, **fields)


def place(job: Job, *where: str) -> Plan:
    first, *rest = where
    return Plan(
        "test",
        places=(
            Place(
                job.pk, first, (0, 1, 2, 3), members=tuple(Member(n, (0, 1, 2, 3)) for n in rest)
            ),
        ),
    )


def dispatched(owner: Any, team: Any, sent: list[Any], *where: str) -> Job:
    job = gang(owner, team)
    outcome = apply_plan(build_snapshot(), place(job, *where or ("sim-a", "sim-b")))
    assert outcome.placed == [job.pk], outcome.skipped
    sent.clear()
    return Job.objects.get(pk=job.pk)


def report(job: Job, node: str, state: str, **kw: Any) -> bool:
    return job_report_apply(
        node=Node.objects.get(name=node), job_id=job.pk, attempt=job.attempt, state=state, **kw
    )


def running(owner: Any, team: Any, sent: list[Any]) -> Job:
    job = dispatched(owner, team, sent)
    report(job, "sim-a", "running", pid=100)
    report(job, "sim-b", "running", pid=200)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    sent.clear()
    return job


def messages(sent: list[Any], task: str) -> dict[str, dict[str, Any]]:
    return {queue.removeprefix("node."): args for t, queue, args in sent if t == task}


def test_a_gang_placement_books_every_member_and_sends_one_signed_start_each(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = gang(owner, team)
    outcome = apply_plan(build_snapshot(), place(job, "sim-a", "sim-b"))
    assert outcome.placed == [job.pk]
    job.refresh_from_db()
    assert job.node is not None
    assert (job.state, job.node.name, job.gpu_indices, job.attempt) == (
        JobState.ASSIGNED, "sim-a", [0, 1, 2, 3], 1,
    )  # fmt: skip
    members = list(JobMember.objects.filter(job=job).order_by("rank"))
    assert [(m.rank, m.node and m.node.name, m.attempt, m.state) for m in members] == [
        (0, "sim-a", 1, "assigned"), (1, "sim-b", 1, "assigned"),
    ]  # fmt: skip
    starts = messages(sent, START)
    assert set(starts) == {"sim-a", "sim-b"} and len([s for s in sent if s[0] == START]) == 2
    a, b = starts["sim-a"]["spec"], starts["sim-b"]["spec"]
    assert a["rendezvous"]["rank"] == 0 and b["rendezvous"]["rank"] == 1
    for spec in (a, b):
        rdv = spec["rendezvous"]
        assert (rdv["nnodes"], rdv["gpus_per_node"], rdv["world_size"]) == (2, 4, 8)
        assert rdv["master_addr"] == "10.0.0.1" and rdv["hosts"] == ["10.0.0.1", "10.0.0.2"]
        assert 29500 <= rdv["master_port"] <= 29999
        assert (spec["cpus"], spec["memory_mb"], spec["gpu_indices"]) == (8, 16384, [0, 1, 2, 3])
    assert a["rendezvous"]["master_port"] == b["rendezvous"]["master_port"]
    assert {s[2]["attempt"] for s in sent if s[0] == START} == {1}


def test_the_snapshot_counts_every_member_and_host_resources(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = dispatched(owner, team, sent)
    snap = build_snapshot().core
    by_name = {n.name: n for n in snap.nodes}
    for name in ("sim-a", "sim-b"):
        node = by_name[name]
        assert not any(g.is_whole_free for g in node.gpus)
        assert (node.free_cpus, node.free_memory_mb) == (24, 65536 - 16384)
    assert all(g.is_whole_free for g in by_name["sim-c"].gpus)
    assert by_name["sim-c"].free_cpus == 32
    (run,) = snap.running
    assert run.id == job.pk and run.node == "sim-a"
    assert run.members == (Member("sim-b", (0, 1, 2, 3)),)
    assert (run.gpus_per_node, run.cpus, run.memory_mb) == (4, 8, 16384)


def test_a_gang_placement_is_skipped_whole_when_one_node_no_longer_fits(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    host_node("sim-d", "10.0.0.4", gpus=5)
    job = gang(owner, team, cpus=24)
    other = make_job(owner, team, gpus=0, gpu_memory_mb=1000, gpu_compute_percent=10, cpus=16)
    snap = build_snapshot()
    # After the snapshot, another job takes 16 of sim-d's 32 cores (on a GPU of its own).
    placed = apply_plan(snap, Plan("test", places=(Place(other.pk, "sim-d", (4,)),)))
    assert placed.placed == [other.pk]
    sent.clear()
    outcome = apply_plan(snap, place(job, "sim-a", "sim-d"))
    assert outcome.placed == []
    assert "sim-d: only 16 of its 32 CPU cores are free" in outcome.skipped[job.pk]
    assert not JobMember.objects.filter(job=job).exists()
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING
    assert sent == []
    # A placement of the wrong shape is refused too.
    bad = apply_plan(build_snapshot(), place(job, "sim-a"))
    assert "spans 2 nodes" in bad.skipped[job.pk]


def test_the_job_runs_only_when_every_member_started(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = dispatched(owner, team, sent)
    assert report(job, "sim-a", "running", pid=100)
    assert Job.objects.get(pk=job.pk).state == JobState.ASSIGNED
    # Duplicated: recorded, changes nothing.
    assert not report(job, "sim-a", "running", pid=100)
    assert Job.objects.get(pk=job.pk).state == JobState.ASSIGNED
    # A node that has no member of the job is ignored.
    assert not report(job, "sim-c", "running", pid=1)
    assert report(job, "sim-b", "running", pid=200)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.pid == 100
    assert JobEvent.objects.filter(job=job, to_state="running", applied=True).count() == 1
    assert set(JobMember.objects.filter(job=job).values_list("state", flat=True)) == {"running"}


def test_the_job_succeeds_when_every_member_succeeded_in_any_order(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = dispatched(owner, team, sent)
    # sim-b's success arrives before its (and sim-a's) running report.
    assert report(job, "sim-b", "succeeded")
    assert Job.objects.get(pk=job.pk).state == JobState.ASSIGNED
    assert report(job, "sim-a", "running", pid=100)
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert not report(job, "sim-b", "running", pid=200)  # late, after its end
    assert report(job, "sim-a", "succeeded")
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0
    assert not report(job, "sim-a", "succeeded")  # duplicated
    assert [s for s in sent if s[0] == STOP] == []


def test_one_member_failing_fails_the_job_and_stops_the_others(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = running(owner, team, sent)
    assert report(job, "sim-b", "failed", exit_code=3, reason="exit 3")
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.exit_code == 3
    assert "member 1 on node sim-b failed" in job.state_reason
    stops = messages(sent, STOP)
    assert set(stops) == {"sim-a"} and stops["sim-a"]["attempt"] == 1
    # sim-a's share stays held until sim-a reports that member's end.
    hold = GpuRelease.objects.get(job=job)
    assert (hold.node.name, hold.gpu_indices, hold.cpus, hold.memory_mb) == (
        "sim-a", [0, 1, 2, 3], 8, 16384,
    )  # fmt: skip
    states = dict(JobMember.objects.filter(job=job).values_list("rank", "state"))
    assert states == {0: "stopped", 1: "failed"}
    assert not report(job, "sim-a", "cancelled", reason="stopped")
    assert not GpuRelease.objects.filter(job=job).exists()
    assert Job.objects.get(pk=job.pk).state == JobState.FAILED
    by_name = {n.name: n for n in build_snapshot().core.nodes}
    assert all(g.is_whole_free for g in by_name["sim-a"].gpus)
    assert by_name["sim-a"].free_cpus == 32 and by_name["sim-b"].free_memory_mb == 65536


def test_a_lost_member_requeues_the_gang_once_and_old_reports_are_ignored(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = running(owner, team, sent)
    assert report(job, "sim-b", "lost", reason="lease ran out")
    job.refresh_from_db()
    assert (job.state, job.requeues, job.attempt) == (JobState.PENDING, 1, 1)
    assert set(messages(sent, STOP)) == {"sim-a"}
    # Placed again: one new attempt for the whole gang, on other nodes.
    outcome = apply_plan(build_snapshot(), place(job, "sim-c", "sim-b"))
    assert outcome.placed == [job.pk]
    job.refresh_from_db()
    assert job.attempt == 2
    assert JobMember.objects.filter(job=job, attempt=2).count() == 2
    # A late report of the old attempt changes nothing.
    old = job_report_apply(
        node=Node.objects.get(name="sim-a"), job_id=job.pk, attempt=1, state="failed"
    )
    assert not old
    job.refresh_from_db()
    assert job.state == JobState.ASSIGNED and job.attempt == 2


def test_a_member_node_down_past_its_lease_loses_the_gang_and_stops_the_rest(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = running(owner, team, sent)
    long_ago = timezone.now() - timedelta(hours=1)
    Node.objects.filter(name="sim-b").update(last_heartbeat=long_ago)
    summary = nodes_reap()
    assert summary["nodes_down"] == 1 and summary["jobs_lost"] == 1
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.requeues == 1
    assert "node sim-b went down" in job.state_reason
    assert set(messages(sent, STOP)) == {"sim-a"}
    assert list(GpuRelease.objects.filter(job=job).values_list("node__name", flat=True)) == [
        "sim-a"
    ]


def test_a_member_that_never_starts_sends_the_gang_back_and_stops_every_member(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any], settings: Any
) -> None:
    job = dispatched(owner, team, sent)
    report(job, "sim-a", "running", pid=100)
    settings.FLEET_START_TIMEOUT = 60
    Job.objects.filter(pk=job.pk).update(assigned_at=timezone.now() - timedelta(seconds=61))
    assert nodes_reap()["starts_given_up"] == 1
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert set(messages(sent, STOP)) == {"sim-a", "sim-b"}
    assert GpuRelease.objects.filter(job=job).count() == 2


def test_an_unconfirmed_member_is_sent_its_start_again_alone(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any], settings: Any
) -> None:
    job = dispatched(owner, team, sent)
    report(job, "sim-a", "running", pid=100)
    settings.FLEET_START_RESEND = 5
    Job.objects.filter(pk=job.pk).update(assigned_at=timezone.now() - timedelta(seconds=6))
    sent.clear()
    assert nodes_reap()["starts_resent"] == 1
    starts = messages(sent, START)
    assert set(starts) == {"sim-b"} and starts["sim-b"]["spec"]["rendezvous"]["rank"] == 1


def test_cancel_stops_every_member_once(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = running(owner, team, sent)
    job_cancel(user=owner, job=job)
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert sorted(q for t, q, _ in sent if t == STOP) == ["node.sim-a", "node.sim-b"]
    assert GpuRelease.objects.filter(job=job).count() == 2
    # Each member's end frees only its own node's hold.
    report(job, "sim-b", "cancelled")
    assert list(GpuRelease.objects.filter(job=job).values_list("node__name", flat=True)) == [
        "sim-a"
    ]


def test_a_single_node_job_gets_a_rank_0_member_and_a_one_node_rendezvous(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = make_job(owner, team, gpus=2)
    apply_plan(build_snapshot(), Plan("test", places=(Place(job.pk, "sim-c", (1, 2)),)))
    ((task, queue, args),) = sent
    assert (task, queue) == (START, "node.sim-c")
    rdv = args["spec"]["rendezvous"]
    assert (rdv["rank"], rdv["nnodes"], rdv["world_size"], rdv["gpus_per_node"]) == (0, 1, 2, 2)
    assert rdv["hosts"] == ["10.0.0.3"] == [rdv["master_addr"]]
    member = JobMember.objects.get(job=job)
    assert (member.rank, member.node and member.node.name, member.gpu_indices) == (
        0, "sim-c", [1, 2],
    )  # fmt: skip
    report(Job.objects.get(pk=job.pk), "sim-c", "running", pid=7)
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert JobMember.objects.get(job=job).state == "running"


def test_heartbeats_of_a_member_node_confirm_its_start_and_never_stop_it(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    job = dispatched(owner, team, sent)
    report(job, "sim-a", "running", pid=100)
    b = Node.objects.get(name="sim-b")
    # sim-b's start report was lost; its heartbeat lists the attempt: that confirms it.
    assert agent_heartbeat(node=b, running=[[job.pk, 1, 200, [0, 1, 2, 3]]]) == []
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert JobMember.objects.get(job=job, rank=1).pid == 200
    events = JobEvent.objects.filter(job=job).count()
    # Later heartbeats of both nodes list it: nothing to stop, nothing recorded again.
    for name, pid in (("sim-a", 100), ("sim-b", 200)):
        node = Node.objects.get(name=name)
        assert agent_heartbeat(node=node, running=[[job.pk, 1, pid, [0, 1, 2, 3]]]) == []
    assert JobEvent.objects.filter(job=job).count() == events
    assert [s for s in sent if s[0] == STOP] == []
    # A node with no member of the job that runs it is told to stop it.
    c = Node.objects.get(name="sim-c")
    assert agent_heartbeat(node=c, running=[[job.pk, 1, 300, [0]]]) == [(job.pk, 1)]


def test_every_start_is_one_the_agent_accepts(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    """The contract with workers/executor/spec.py: each member's start parses there whole,
    and its environment has the rendezvous variables."""
    job = gang(owner, team, gpus=12)
    apply_plan(build_snapshot(), place(job, "sim-b", "sim-a", "sim-c"))
    starts = [args for task, _, args in sent if task == START]
    assert len(starts) == 3
    envs: dict[int, Any] = {}
    for args in starts:
        spec = spec_from_start(
            args["job_id"], args["attempt"], args["spec"], log_path="/dev/null", default_grace=5
        )
        envs[spec.rendezvous.rank if spec.rendezvous else -1] = spec.rendezvous
    assert sorted(envs) == [0, 1, 2]
    rdv = envs[1]
    assert rdv is not None
    assert (rdv.master_addr, rdv.hosts, rdv.world_size) == (
        "10.0.0.2", ("10.0.0.2", "10.0.0.1", "10.0.0.3"), 12,
    )  # fmt: skip
