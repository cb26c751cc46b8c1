"""Rank 0's rendezvous port: chosen in the dispatch transaction among the ports no other
live attempt with rank 0 on that node uses, stored with the attempt's rank 0 member, and
named again by every start sent for that attempt."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from fleet.models import Job, JobMember, Node
from fleet.services import dispatch, messaging
from fleet.services.dispatch import send_start_on_commit
from fleet.services.job_reports import job_report_apply
from scheduler.core.model import Member, Place, Plan
from scheduler.cycle.apply import apply_plan
from scheduler.cycle.snapshot import build_snapshot
from tests.scheduler.cycle.conftest import make_job, make_node

pytestmark = pytest.mark.django_db(transaction=True)

START = messaging.START_JOB_TASK


@pytest.fixture
def nodes(db: Any) -> list[Node]:
    out = []
    for i, name in enumerate(("sim-a", "sim-b", "sim-c")):
        node = make_node(name, 4)
        Node.objects.filter(pk=node.pk).update(
            cpus=32, memory_mb=65536, address=f"10.0.0.{i + 1}", last_heartbeat=timezone.now()
        )
        out.append(node)
    return out


@pytest.fixture
def same_start(monkeypatch: Any) -> None:
    """Every attempt's search begins at the same port: what two attempts whose hashes
    collide see (without a choice, they would both bind 29500)."""
    monkeypatch.setattr(dispatch, "master_port", lambda job_id, attempt: 29500)


def gang(owner: Any, team: Any) -> Job:
    return make_job(owner, team, gpus=4, gpus_per_node=2)


def place(
    job: Job, first: str, indices: tuple[int, ...], other: str, other_indices: tuple[int, ...] = ()
) -> Place:
    return Place(job.pk, first, indices, members=(Member(other, other_indices or indices),))


def ports(sent: list[Any]) -> dict[tuple[int, str], int]:
    return {
        (args["job_id"], queue.removeprefix("node.")): args["spec"]["rendezvous"]["master_port"]
        for task, queue, args in sent
        if task == START
    }


def stored(job: Job) -> int | None:
    job.refresh_from_db()
    return (
        JobMember.objects.filter(job=job, attempt=job.attempt, rank=0)
        .values_list("master_port", flat=True)
        .get()
    )


def test_two_gangs_with_rank_0_on_one_node_get_different_ports(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any], same_start: None
) -> None:
    one, two = gang(owner, team), gang(owner, team)
    plan = Plan(
        "test",
        places=(place(one, "sim-a", (0, 1), "sim-b"), place(two, "sim-a", (2, 3), "sim-c")),
    )
    assert sorted(apply_plan(build_snapshot(), plan).placed) == [one.pk, two.pk]
    got = ports(sent)
    # Every member of an attempt names its rank 0's port; the two attempts differ.
    assert got[(one.pk, "sim-a")] == got[(one.pk, "sim-b")] == stored(one)
    assert got[(two.pk, "sim-a")] == got[(two.pk, "sim-c")] == stored(two)
    assert {stored(one), stored(two)} == {29500, 29501}


def test_a_start_sent_again_names_the_stored_port(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any], same_start: None
) -> None:
    one = gang(owner, team)
    apply_plan(build_snapshot(), Plan("test", places=(place(one, "sim-a", (0, 1), "sim-b"),)))
    assert stored(one) == 29500
    # Rank 1 started; rank 0's start is sent again (the reaper's resend), after another
    # gang took the next port on sim-a: the same port, to rank 0 only.
    job_report_apply(
        node=nodes[1], job_id=one.pk, attempt=one.attempt, state="running", pid=7, exit_code=None
    )
    two = gang(owner, team)
    apply_plan(build_snapshot(), Plan("test", places=(place(two, "sim-a", (2, 3), "sim-c"),)))
    assert stored(two) == 29501
    sent.clear()
    one.refresh_from_db()
    with transaction.atomic():
        send_start_on_commit(one, only_waiting=True)
    assert ports(sent) == {(one.pk, "sim-a"): 29500}


def test_ports_of_ended_attempts_are_free_again(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any], same_start: None
) -> None:
    one = gang(owner, team)
    apply_plan(build_snapshot(), Plan("test", places=(place(one, "sim-a", (0, 1), "sim-b"),)))
    # Stopped a moment ago: its process may still hold the port in its grace.
    JobMember.objects.filter(job=one).update(state="stopped", finished_at=timezone.now())
    Job.objects.filter(pk=one.pk).update(state="cancelled")
    two = gang(owner, team)
    apply_plan(build_snapshot(), Plan("test", places=(place(two, "sim-a", (2, 3), "sim-c"),)))
    assert stored(two) == 29501
    # Long ended: its port may be used again.
    JobMember.objects.filter(job=one).update(finished_at=timezone.now() - timedelta(hours=1))
    JobMember.objects.filter(job=two).update(state="succeeded", finished_at=timezone.now())
    three = gang(owner, team)
    apply_plan(build_snapshot(), Plan("test", places=(place(three, "sim-a", (0, 1), "sim-b"),)))
    assert stored(three) == 29500


def test_only_rank_0_on_the_same_node_competes(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any], same_start: None
) -> None:
    one, two = gang(owner, team), gang(owner, team)
    plan = Plan(
        "test",
        places=(place(one, "sim-a", (0, 1), "sim-b"), place(two, "sim-c", (0, 1), "sim-a", (2, 3))),
    )
    apply_plan(build_snapshot(), plan)
    # two's rank 0 is on sim-c, where nothing else binds: 29500 is free there.
    assert (stored(one), stored(two)) == (29500, 29500)


def test_an_exhausted_range_falls_back_with_a_warning(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any], settings: Any, caplog: Any
) -> None:
    settings.FLEET_RENDEZVOUS_PORTS = "29600-29601"
    jobs = [make_job(owner, team, gpus=2, gpus_per_node=1) for _ in range(3)]
    plan = Plan(
        "test",
        places=(
            place(jobs[0], "sim-a", (0,), "sim-b"),
            place(jobs[1], "sim-a", (1,), "sim-c"),
        ),
    )
    apply_plan(build_snapshot(), plan)
    assert {stored(jobs[0]), stored(jobs[1])} == {29600, 29601}
    with caplog.at_level(logging.WARNING, logger="fleet.services.dispatch"):
        apply_plan(build_snapshot(), Plan("test", places=(place(jobs[2], "sim-a", (2,), "sim-b"),)))
    assert stored(jobs[2]) == dispatch.master_port(jobs[2].pk, 1)
    assert "every rendezvous port of 29600-29601 is in use" in caplog.text


def test_single_node_jobs_on_one_node_get_different_ports(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any], same_start: None
) -> None:
    one, two = make_job(owner, team, gpus=1), make_job(owner, team, gpus=1)
    plan = Plan("test", places=(Place(one.pk, "sim-a", (0,)), Place(two.pk, "sim-a", (1,))))
    apply_plan(build_snapshot(), plan)
    got = ports(sent)
    assert {got[(one.pk, "sim-a")], got[(two.pk, "sim-a")]} == {29500, 29501}


def test_a_job_without_member_rows_keeps_its_starting_point(
    owner: Any, team: Any, nodes: list[Node], sent: list[Any]
) -> None:
    # Dispatched before attempts had member rows: nothing to store the port with, so every
    # start sent again names the attempt's starting point.
    job = make_job(owner, team, gpus=1)
    Job.objects.filter(pk=job.pk).update(
        state="assigned", node=nodes[0], gpu_indices=[0], attempt=3, assigned_at=timezone.now()
    )
    job.refresh_from_db()
    for _ in range(2):
        with transaction.atomic():
            send_start_on_commit(job)
    assert [args["spec"]["rendezvous"]["master_port"] for _, _, args in sent] == [
        dispatch.master_port(job.pk, 3)
    ] * 2
