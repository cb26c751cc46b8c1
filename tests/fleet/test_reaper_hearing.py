"""The reaper counts a node's silence and a start's wait only while the control side could
hear: a stretch in which it did not run (PostgreSQL down, every control worker gone) is
not held against anyone, so a job that finished meanwhile is recorded from its agent's
repeated outcome instead of being declared lost and run again."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.utils import timezone

from fleet.models import Job, JobEvent, Node
from fleet.services.agents import agent_heartbeat
from fleet.services.job_states import SCHEDULER, job_transition
from fleet.services.reaper import HEARING_KEY, lost_after, nodes_reap, start_timeout_s
from tests.factories import JobFactory
from tests.fleet.test_releases import _running

pytestmark = pytest.mark.django_db


@pytest.fixture
def fresh_hearing() -> None:
    cache.delete(HEARING_KEY)


def _heard(node: Node, at: Any) -> None:
    Node.objects.filter(pk=node.pk).update(last_heartbeat=at, state="up")


def test_a_job_that_ended_while_the_control_side_was_deaf_is_recorded_not_run_again(
    owner: Any, team: Any, fleet_nodes: Any, fresh_hearing: None
) -> None:
    node = fleet_nodes[0]
    job = _running(owner, team, node, 0)
    t0 = timezone.now()
    _heard(node, t0)
    nodes_reap(now=t0)
    # PostgreSQL is down for longer than the node's whole lease: no round runs, nothing
    # is heard. The job ends meanwhile; its agent keeps the outcome.
    back = t0 + lost_after(Node.objects.get(pk=node.pk)) + timedelta(seconds=60)
    summary = nodes_reap(now=back)
    assert summary["nodes_down"] == 0 and summary["jobs_lost"] == 0
    assert Job.objects.get(pk=job.pk).state == "running"
    # The agent's next heartbeat carries the outcome.
    agent_heartbeat(
        node=node,
        running=[],
        outcomes=[{"job_id": job.pk, "attempt": 1, "state": "succeeded", "exit_code": 0}],
        at=time.time(),
        lease=60,
        now=back + timedelta(seconds=1),
    )
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("succeeded", 1)
    assert not JobEvent.objects.filter(job=job, to_state="pending").exists()


def test_a_node_silent_before_and_after_the_gap_is_still_declared_lost(
    owner: Any, team: Any, fleet_nodes: Any, fresh_hearing: None
) -> None:
    """Only the gap is forgiven: silence on either side of it still counts."""
    node = fleet_nodes[0]
    job = _running(owner, team, node, 0)
    t0 = timezone.now()
    _heard(node, t0)
    nodes_reap(now=t0)
    node = Node.objects.get(pk=node.pk)
    timeout = timedelta(seconds=node.heartbeat_timeout)
    # Silent for half its timeout while the reaper runs...
    nodes_reap(now=t0 + timeout / 2)
    # ...then a gap of ten minutes...
    gap_end = t0 + timeout / 2 + timedelta(minutes=10)
    assert nodes_reap(now=gap_end)["nodes_down"] == 0
    # ...then silent again: down once the two stretches add up to the timeout, its jobs
    # lost once they add up to the lease and its margins.
    assert nodes_reap(now=gap_end + timeout / 4)["nodes_down"] == 0
    assert nodes_reap(now=gap_end + timeout / 2 + timedelta(seconds=1))["nodes_down"] == 1
    lost_at = gap_end - timeout / 2 + lost_after(node) + timedelta(seconds=1)
    step = gap_end + timeout / 2 + timedelta(seconds=1)
    while step + timeout / 2 < lost_at - timedelta(seconds=2):  # rounds keep running
        step += timeout / 2
        assert nodes_reap(now=step)["jobs_lost"] == 0
    assert nodes_reap(now=lost_at)["jobs_lost"] == 1
    assert Job.objects.get(pk=job.pk).state == "pending"


def test_a_node_heard_inside_the_gap_is_judged_from_the_gap_s_end(
    fleet_nodes: Any, fresh_hearing: None
) -> None:
    """A heartbeat applied after the reaper's last round shows the control side listened
    then, not that it went on listening: a database outage may begin right after it. So the
    node's silence counts from the gap's end; it still goes down one timeout later."""
    node = fleet_nodes[0]
    t0 = timezone.now()
    _heard(node, t0)
    nodes_reap(now=t0)
    timeout = timedelta(seconds=Node.objects.get(pk=node.pk).heartbeat_timeout)
    assert timeout < timedelta(minutes=5)
    _heard(node, t0 + timedelta(seconds=1))  # just after the round, then deaf
    end = t0 + timedelta(minutes=10)
    assert nodes_reap(now=end)["nodes_down"] == 0
    assert nodes_reap(now=end + timeout / 2)["nodes_down"] == 0
    assert nodes_reap(now=end + timeout + timedelta(seconds=1))["nodes_down"] == 1
    assert "no heartbeat" in Node.objects.get(pk=node.pk).state_reason


def test_an_unconfirmed_start_is_not_given_up_for_a_wait_the_control_side_did_not_hear(
    owner: Any, team: Any, fleet_nodes: Any, fresh_hearing: None
) -> None:
    node = fleet_nodes[0]
    job = JobFactory(owner=owner, team=team)
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [0]},
    )  # fmt: skip
    assigned_at = Job.objects.get(pk=job.pk).assigned_at
    timeout = timedelta(seconds=start_timeout_s())
    _heard(node, assigned_at)
    nodes_reap(now=assigned_at)
    back = assigned_at + timeout * 3
    _heard(node, back)  # its agent is heard again at once
    assert nodes_reap(now=back)["starts_given_up"] == 0
    assert Job.objects.get(pk=job.pk).state == "assigned"
    _heard(node, back + timeout)
    assert nodes_reap(now=back + timeout + timedelta(seconds=1))["starts_given_up"] == 1
    assert Job.objects.get(pk=job.pk).state == "pending"


def test_with_no_record_of_past_rounds_everything_before_this_one_is_forgiven(
    owner: Any, team: Any, fleet_nodes: Any, fresh_hearing: None
) -> None:
    """Redis lost its data (or this is the first round): nobody knows how long the
    control side was deaf, so old silence counts from this round."""
    node, other = fleet_nodes
    job = _running(owner, team, node, 0)
    t0 = timezone.now()
    for each in fleet_nodes:
        _heard(each, t0 - timedelta(hours=1))
    assert nodes_reap(now=t0) == {
        "nodes_down": 0, "jobs_lost": 0, "starts_resent": 0, "starts_given_up": 0
    }  # fmt: skip
    assert Job.objects.get(pk=job.pk).state == "running"
    _heard(other, t0)
    timeout = Node.objects.get(pk=node.pk).heartbeat_timeout
    assert nodes_reap(now=t0 + timedelta(seconds=timeout + 1))["nodes_down"] == 1
    assert Node.objects.get(pk=node.pk).state == "down"
