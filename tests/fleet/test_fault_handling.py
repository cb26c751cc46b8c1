"""The control side under faults: outcomes repeated by heartbeats, late successes, reports
that race, reordered heartbeats, nodes back with old processes, fenced and resent starts."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from fleet.models import Job, JobEvent, Node
from fleet.services import job_reports, messaging
from fleet.services.agents import agent_heartbeat
from fleet.services.job_reports import job_report_apply, requeue_lost
from fleet.services.job_states import SCHEDULER, job_transition
from fleet.services.jobs import job_cancel
from fleet.services.reaper import nodes_reap
from tests.factories import JobFactory
from tests.fleet.test_releases import _free, _running
from workers.fence import FENCE_KEY, dispatch_token

pytestmark = pytest.mark.django_db


def outcome(job: Job, state: str = "succeeded", **extra: Any) -> dict[str, Any]:
    return {"job_id": job.pk, "attempt": job.attempt, "state": state, "pid": 4242,
            "exit_code": 0 if state == "succeeded" else 1, "reason": "", **extra}  # fmt: skip


def test_an_outcome_repeated_by_a_heartbeat_is_applied_once_and_acknowledged(
    owner: Any, team: Any, fleet_nodes: Any, sent: Any, django_capture_on_commit_callbacks: Any
) -> None:
    node = fleet_nodes[0]
    job = _running(owner, team, node, 0)
    t = time.time()
    with django_capture_on_commit_callbacks(execute=True):
        # The success report was lost in the broker; the heartbeat repeats it, twice.
        agent_heartbeat(node=node, running=[], outcomes=[outcome(job)], at=t, lease=60)
        agent_heartbeat(node=node, running=[], outcomes=[outcome(job)], at=t + 1, lease=60)
    job.refresh_from_db()
    assert job.state == "succeeded" and job.exit_code == 0
    assert JobEvent.objects.filter(job=job, to_state="succeeded", applied=True).count() == 1
    acks = [kw for task, _q, kw in sent if task == "workers.tasks.acknowledge"]
    assert acks == [
        {"heard_at": t, "outcomes": [[job.pk, 1]]},
        {"heard_at": t + 1, "outcomes": [[job.pk, 1]]},
    ]
    node.refresh_from_db()
    assert node.lease_seconds == 60


def test_a_success_after_the_job_was_given_up_counts_until_it_is_dispatched_again(
    owner: Any, team: Any, fleet_nodes: Any
) -> None:
    node, other = fleet_nodes[0], fleet_nodes[1]
    done_late = _running(owner, team, node, 0)
    requeue_lost(done_late, "node went down")
    assert Job.objects.get(pk=done_late.pk).state == "pending"
    # From another node, the report is not this attempt's.
    assert not job_report_apply(node=other, job_id=done_late.pk, attempt=1, state="succeeded")
    assert job_report_apply(node=node, job_id=done_late.pk, attempt=1, state="succeeded")
    done_late.refresh_from_db()
    assert (done_late.state, done_late.attempt, done_late.requeues) == ("succeeded", 1, 1)

    redispatched = _running(owner, team, node, 1)
    requeue_lost(redispatched, "node went down")
    job_transition(
        job_id=redispatched.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": other, "gpu_indices": [0]},
    )  # fmt: skip
    assert not job_report_apply(node=node, job_id=redispatched.pk, attempt=1, state="succeeded")
    assert Job.objects.get(pk=redispatched.pk).state == "assigned"


def test_a_report_that_races_another_change_is_read_again_not_dropped(
    owner: Any, team: Any, fleet_nodes: Any, monkeypatch: Any
) -> None:
    node = fleet_nodes[0]
    job = JobFactory(owner=owner, team=team)
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [0]},
    )  # fmt: skip
    real = job_reports.job_transition
    raced: list[bool] = []

    def running_lands_first(**kwargs: Any) -> Any:
        if not raced:  # the "running" report, applied by another worker between read and write
            raced.append(True)
            real(job_id=job.pk, action="start", actor=SCHEDULER, attempt=1)
        return real(**kwargs)

    monkeypatch.setattr(job_reports, "job_transition", running_lands_first)
    assert job_report_apply(node=node, job_id=job.pk, attempt=1, state="succeeded")
    assert Job.objects.get(pk=job.pk).state == "succeeded"


def test_a_reordered_heartbeat_loses_nothing_and_a_listed_job_is_no_longer_missing(
    owner: Any, team: Any, fleet_nodes: Any, settings: Any
) -> None:
    settings.FLEET_MISSING_GRACE = 5
    node = fleet_nodes[0]
    job = _running(owner, team, node, 0)
    now = timezone.now()
    t = now.timestamp()  # the agent's clock, the same as the control side's
    listed = [[job.pk, 1, 4242, [0]]]
    agent_heartbeat(node=node, running=listed, at=t, now=now)
    # A heartbeat sent before the job started arrives late: it does not list the job.
    agent_heartbeat(node=node, running=[], at=t - 1, now=now + timedelta(seconds=1))
    agent_heartbeat(node=node, running=listed, at=t + 1, now=now + timedelta(seconds=2))
    agent_heartbeat(node=node, running=listed, at=t + 20, now=now + timedelta(seconds=20))
    assert Job.objects.get(pk=job.pk).state == "running"
    # Missing from current heartbeats for longer than the grace: lost.
    agent_heartbeat(node=node, running=[], at=t + 21, now=now + timedelta(seconds=21))
    agent_heartbeat(node=node, running=[], at=t + 27, now=now + timedelta(seconds=27))
    assert Job.objects.get(pk=job.pk).state == "pending"


def test_a_node_back_with_an_old_process_keeps_its_gpus_until_the_process_is_gone(
    owner: Any, team: Any, fleet_nodes: Any, sent: Any, django_capture_on_commit_callbacks: Any
) -> None:
    node = fleet_nodes[0]
    job = _running(owner, team, node, 1)
    requeue_lost(job, "node went down")
    assert _free(node.name, 1)
    with django_capture_on_commit_callbacks(execute=True):
        agent_heartbeat(node=node, running=[[job.pk, 1, 4242, [1]]], at=time.time())
    assert not _free(node.name, 1)
    stops = [kw for task, _q, kw in sent if task == "workers.tasks.reconcile"]
    assert stops and stops[0]["stop"] == [[job.pk, 1]]
    agent_heartbeat(node=node, running=[], at=time.time())
    assert _free(node.name, 1)


def test_ending_an_attempt_fences_its_dispatch_at_the_broker(
    owner: Any, team: Any, fleet_nodes: Any, django_capture_on_commit_callbacks: Any
) -> None:
    node = fleet_nodes[0]
    job = JobFactory(owner=owner, team=team)
    with django_capture_on_commit_callbacks(execute=True):
        assigned = job_transition(
            job_id=job.pk, action="dispatch", actor=SCHEDULER,
            fields={"node": node, "gpu_indices": [0]},
        )  # fmt: skip
    assert assigned.assigned_at is not None
    key = FENCE_KEY.format(job.pk, 1, dispatch_token(assigned.assigned_at.timestamp()))
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    assert not broker.exists(key)
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(user=owner, job=assigned)
    assert broker.exists(key)
    broker.delete(key)


def test_an_unconfirmed_start_is_sent_again_before_it_is_given_up(
    owner: Any, team: Any, fleet_nodes: Any, sent: Any, settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:  # fmt: skip
    settings.FLEET_START_RESEND = 10
    settings.FLEET_START_TIMEOUT = 60
    node = fleet_nodes[0]
    job = JobFactory(owner=owner, team=team)
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [0]},
    )  # fmt: skip
    now = timezone.now()
    for n in fleet_nodes:
        n.last_heartbeat = now + timedelta(seconds=100)
        n.save()
    with django_capture_on_commit_callbacks(execute=True):
        assert nodes_reap(now=now + timedelta(seconds=5))["starts_resent"] == 0
        assert nodes_reap(now=now + timedelta(seconds=15))["starts_resent"] == 1
    starts = [kw for task, q, kw in sent if task == messaging.START_JOB_TASK]
    assert [(s["job_id"], s["attempt"]) for s in starts] == [(job.pk, 1)]


def test_a_heartbeat_delivered_long_after_it_was_sent_is_no_sign_of_life(
    owner: Any, team: Any, fleet_nodes: Any
) -> None:
    node = fleet_nodes[0]
    job = _running(owner, team, node, 0)
    node.state, node.last_heartbeat = "down", None
    node.save()
    now = timezone.now()
    sent = now.timestamp() - node.heartbeat_timeout - 15  # retried through an outage
    agent_heartbeat(node=node, running=[], outcomes=[outcome(job)], at=sent, now=now)
    node.refresh_from_db()
    assert (node.state, node.last_heartbeat) == ("down", None)
    assert Job.objects.get(pk=job.pk).state == "succeeded"  # its outcome still counts
    agent_heartbeat(node=node, running=[], at=now.timestamp() - 1, now=now)
    assert Node.objects.get(pk=node.pk).state == "up"
