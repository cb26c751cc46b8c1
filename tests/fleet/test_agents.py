"""Control side of the agents: keys, registration, heartbeats, fenced reports, the reaper."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from fleet import tasks
from fleet.models import Gpu, Job, JobEvent, Node
from fleet.services.agents import agent_heartbeat, agent_register, node_key_create
from fleet.services.job_reports import job_report_apply
from fleet.services.job_states import SCHEDULER, job_transition
from fleet.services.reaper import nodes_reap
from fleet.services.wire import control_public_key
from tests.factories import JobFactory
from workers.wire import Signer, key_generate

pytestmark = pytest.mark.django_db

A100 = {"model": "A100-80GB", "memory_total_mb": 81920, "name": "Simulated A100"}


def gpus(*uuids: str) -> list[dict[str, Any]]:
    return [{"index": i, "uuid": u, **A100} for i, u in enumerate(uuids)]


@pytest.fixture
def node_key() -> tuple[Node, str]:
    node, key = node_key_create(name="gpu-01")
    agent_register(node=node, backend="simulated", agent_version="1", gpus=gpus("G0", "G1"))
    node.refresh_from_db()
    return node, key


@pytest.fixture
def node(node_key: tuple[Node, str]) -> Node:
    return node_key[0]


def running_job(node: Node, owner: Any, team: Any, **kw: Any) -> Job:
    job = JobFactory(owner=owner, team=team, **kw)
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [0]},
    )  # fmt: skip
    job_report_apply(node=node, job_id=job.pk, attempt=1, state="running", pid=4321)
    return Job.objects.get(pk=job.pk)


def _seal(key: str, task: str, node: str, ttl: float = 60, **args: Any) -> dict[str, str]:
    return Signer(key).seal(task, node, args, ttl)


def test_add_node_prints_a_key_whose_signatures_only_that_node_gets(capsys: Any) -> None:
    call_command("add_node", "gpu-07")
    out = capsys.readouterr()
    key = out.out.strip().splitlines()[-1]
    node = Node.objects.get(name="gpu-07")
    assert node.state == "down" and node.public_key and key != node.public_key
    assert control_public_key() in out.err  # what the agent needs besides its own key
    register = "fleet.tasks.agent_register"
    tasks.agent_register.run(**_seal(key, register, "gpu-07", gpus=gpus("K0")))
    assert Node.objects.get(pk=node.pk).state == "up"
    call_command("add_node", "gpu-07")  # a new key replaces the old one
    Node.objects.filter(pk=node.pk).update(state="down")
    tasks.agent_register.run(**_seal(key, register, "gpu-07", gpus=gpus("K0")))
    assert Node.objects.get(pk=node.pk).state == "down"


def test_unsigned_forged_expired_replayed_and_misdirected_messages_are_refused(
    caplog: Any,
) -> None:
    node, key = node_key_create(name="gpu-02")
    other, other_key = node_key_create(name="gpu-03")
    beat = "fleet.tasks.agent_heartbeat"
    register = "fleet.tasks.agent_register"
    now = time.time()
    expired = Signer(key, clock=lambda: now - 3600).seal(register, "gpu-02", {}, ttl=60)
    valid = _seal(key, beat, "gpu-02", running=[])
    with caplog.at_level(logging.WARNING, logger="fleet.services.wire"):
        tasks.agent_heartbeat.run(node="gpu-02", key=key, running=[])  # the old, keyed shape
        tasks.agent_register.run(**_seal(key_generate(), register, "gpu-02", gpus=gpus("X0")))
        tasks.agent_register.run(**_seal(other_key, register, "gpu-02", gpus=gpus("X0")))
        tasks.agent_register.run(**expired)
        tasks.agent_register.run(**valid)  # a heartbeat's envelope posted as a registration
        tasks.agent_heartbeat.run(**_seal(key, beat, "nobody", running=[]))
        tampered = dict(valid, m=valid["m"].replace('"running":[]', '"running":[[1,1,1]]'))
        tasks.agent_heartbeat.run(**tampered)
    node.refresh_from_db()
    assert node.state == "down" and node.last_heartbeat is None
    assert not Gpu.objects.filter(node__in=[node, other]).exists()
    for reason in (
        "refused fleet.tasks.agent_heartbeat: unsigned message (no envelope)",
        "refused fleet.tasks.agent_register from node 'gpu-02': bad signature",
        "from node 'gpu-02': expired",
        "signed for task 'fleet.tasks.agent_heartbeat', delivered to 'fleet.tasks.agent_register'",
        "refused fleet.tasks.agent_heartbeat from unknown node 'nobody'",
    ):
        assert reason in caplog.text
    assert caplog.text.count("bad signature") == 3  # a stranger's key, a node's, tampered
    tasks.agent_heartbeat.run(**valid)
    node.refresh_from_db()
    assert node.state == "up" and node.last_heartbeat is not None
    Node.objects.filter(pk=node.pk).update(state="down", last_heartbeat=None)
    with caplog.at_level(logging.WARNING, logger="fleet.services.wire"):
        tasks.agent_heartbeat.run(**valid)  # captured from the broker and sent again
    assert "replayed message" in caplog.text
    assert Node.objects.get(pk=node.pk).last_heartbeat is None


def test_registration_is_idempotent_and_updates_a_changed_gpu_set(node: Node) -> None:
    first = dict(Gpu.objects.filter(node=node).values_list("uuid", "pk"))
    agent_register(node=node, backend="simulated", agent_version="1", gpus=gpus("G0", "G1"))
    assert dict(Gpu.objects.filter(node=node).values_list("uuid", "pk")) == first
    # G1 replaced by G2, one more GPU, G0 now reports more memory.
    changed = gpus("G0", "G2", "G3")
    changed[0]["memory_total_mb"] = 40960
    agent_register(node=node, backend="nvml", agent_version="2", gpus=changed)
    rows = list(Gpu.objects.filter(node=node).order_by("index").values_list("index", "uuid"))
    assert rows == [(0, "G0"), (1, "G2"), (2, "G3")]
    assert Gpu.objects.get(uuid="G0").pk == first["G0"]
    assert Gpu.objects.get(uuid="G0").memory_mb == 40960
    node.refresh_from_db()
    assert (node.gpu_backend, node.agent_version) == ("nvml", "2")


def test_heartbeat_brings_a_down_node_up_but_leaves_a_draining_one_draining(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(state="down", state_reason="no heartbeat")
    agent_heartbeat(node=node)
    assert Node.objects.get(pk=node.pk).state == "up"
    Node.objects.filter(pk=node.pk).update(state="draining")
    agent_heartbeat(node=node)
    assert Node.objects.get(pk=node.pk).state == "draining"


def test_heartbeat_replies_with_attempts_no_longer_assigned_and_confirms_lost_starts(
    node: Node, owner: Any, team: Any, django_capture_on_commit_callbacks: Any
) -> None:
    running = running_job(node, owner, team)
    assigned = JobFactory(owner=owner, team=team)
    job_transition(
        job_id=assigned.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [1]},
    )  # fmt: skip
    cancelled = running_job(node, owner, team)
    job_transition(job_id=cancelled.pk, action="cancel", actor=SCHEDULER)
    with django_capture_on_commit_callbacks() as callbacks:
        stops = agent_heartbeat(
            node=node,
            running=[
                [running.pk, 1, 11],
                [assigned.pk, 1, 12],  # its running report was lost
                [cancelled.pk, 1, 13],
                [running.pk, 0, 14],  # an older attempt of a job
            ],
        )
    assert stops == sorted([(cancelled.pk, 1), (running.pk, 0)])
    # One reconcile message to the node (the confirmed start also queues its notification).
    assert [c.__qualname__.split(".")[0] for c in callbacks if "notify" not in c.__qualname__] == [
        "send_to_node_on_commit"
    ]
    confirmed = Job.objects.get(pk=assigned.pk)
    assert (confirmed.state, confirmed.pid) == ("running", 12)


def test_duplicated_and_reordered_reports_change_nothing_twice(
    node: Node, owner: Any, team: Any
) -> None:
    job = JobFactory(owner=owner, team=team)
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [0]},
    )  # fmt: skip
    # "succeeded" overtakes "running": the start is applied first, then the success.
    assert job_report_apply(node=node, job_id=job.pk, attempt=1, state="succeeded", pid=77)
    assert not job_report_apply(node=node, job_id=job.pk, attempt=1, state="running", pid=77)
    assert not job_report_apply(node=node, job_id=job.pk, attempt=1, state="succeeded", pid=77)
    assert not job_report_apply(node=node, job_id=job.pk, attempt=1, state="failed", exit_code=1)
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.pid) == ("succeeded", 0, 77)
    applied = JobEvent.objects.filter(job=job, applied=True)
    assert [e.to_state for e in applied] == ["assigned", "running", "succeeded"]
    ignored = JobEvent.objects.filter(job=job, applied=False)
    assert ignored.count() == 3
    assert all("already succeeded" in e.reason for e in ignored)


def test_reports_for_an_old_attempt_or_another_node_are_ignored(
    node: Node, owner: Any, team: Any
) -> None:
    other, _ = node_key_create(name="gpu-99")
    job = running_job(node, owner, team)
    job_transition(job_id=job.pk, action="preempt", actor=SCHEDULER, attempt=1)
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [1]},
    )  # fmt: skip
    assert not job_report_apply(node=node, job_id=job.pk, attempt=1, state="preempted")
    assert not job_report_apply(node=other, job_id=job.pk, attempt=2, state="running")
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("assigned", 2)
    reasons = list(JobEvent.objects.filter(job=job, applied=False).values_list("reason", flat=True))
    assert "on attempt 2" in reasons[0] and "not assigned to this node" in reasons[1]


def test_a_late_cancelled_report_does_not_cancel_a_requeued_job(
    node: Node, owner: Any, team: Any
) -> None:
    job = running_job(node, owner, team)
    job_transition(job_id=job.pk, action="requeue", actor=SCHEDULER, attempt=1)
    assert not job_report_apply(node=node, job_id=job.pk, attempt=1, state="cancelled")
    assert Job.objects.get(pk=job.pk).state == "pending"


def test_timeout_and_failure_reports_carry_reason_and_exit_code(
    node: Node, owner: Any, team: Any
) -> None:
    timed = running_job(node, owner, team)
    job_report_apply(
        node=node, job_id=timed.pk, attempt=1, state="timeout",
        reason="exceeded its time limit of 60 s",
    )  # fmt: skip
    failed = running_job(node, owner, team)
    job_report_apply(
        node=node, job_id=failed.pk, attempt=1, state="failed", exit_code=None,
        reason="used 30,000 MB of GPU memory; its request is 10,000 MB (+10%)",
    )  # fmt: skip
    timed.refresh_from_db()
    failed.refresh_from_db()
    assert (timed.state, timed.state_reason) == ("timeout", "exceeded its time limit of 60 s")
    assert failed.state == "failed" and failed.state_reason.startswith("used 30,000 MB")


NOTHING = {"nodes_down": 0, "jobs_lost": 0, "starts_resent": 0, "starts_given_up": 0}


def test_reaper_marks_silent_nodes_down_and_loses_their_jobs_once_the_lease_is_over(
    node: Node, owner: Any, team: Any, settings: Any
) -> None:
    settings.FLEET_JOB_GRACE = 30
    settings.FLEET_LEASE_MARGIN_S = 15
    Node.objects.filter(pk=node.pk).update(lease_seconds=60)
    requeue = running_job(node, owner, team, max_requeues=1)
    give_up = running_job(node, owner, team, max_requeues=0)
    last = Node.objects.get(pk=node.pk).last_heartbeat
    assert last is not None
    assert nodes_reap(now=last + timedelta(seconds=29))["nodes_down"] == 0
    # Down: no new work. Its jobs may still run until its lease (60 s) and their grace
    # (30 s) are over, plus the margin (15 s): they stay where they are, GPUs held.
    summary = nodes_reap(now=last + timedelta(seconds=31))
    assert summary == {**NOTHING, "nodes_down": 1}
    node.refresh_from_db()
    assert node.state == "down" and "no heartbeat since" in node.state_reason
    assert nodes_reap(now=last + timedelta(seconds=104)) == NOTHING
    assert Job.objects.get(pk=requeue.pk).state == "running"
    summary = nodes_reap(now=last + timedelta(seconds=106))
    assert summary == {**NOTHING, "jobs_lost": 2}
    requeue.refresh_from_db()
    give_up.refresh_from_db()
    assert (requeue.state, requeue.requeues, requeue.node_id) == ("pending", 1, None)
    assert give_up.state == "failed" and "not requeued" in give_up.state_reason
    # Nothing left to do: a second round changes nothing.
    assert nodes_reap(now=last + timedelta(seconds=200)) == NOTHING


def test_reaper_gives_up_on_starts_the_node_never_confirmed(
    node: Node, owner: Any, team: Any, django_capture_on_commit_callbacks: Any
) -> None:
    job = JobFactory(owner=owner, team=team)
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [0]},
    )  # fmt: skip
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(last_heartbeat=now + timedelta(seconds=200))
    assert nodes_reap(now=now + timedelta(seconds=60))["starts_given_up"] == 0
    with django_capture_on_commit_callbacks() as callbacks:
        summary = nodes_reap(now=now + timedelta(seconds=200))
    assert summary["starts_given_up"] == 1
    job.refresh_from_db()
    assert (job.state, job.attempt, job.requeues) == ("pending", 1, 0)
    assert "did not confirm the start" in job.state_reason
    assert len(callbacks) >= 1  # the stop for the attempt, in case it starts late


def test_beat_schedules_exist_for_the_reaper_and_rollups() -> None:
    reaper = PeriodicTask.objects.get(task="fleet.tasks.reap_nodes")
    assert reaper.interval is not None and reaper.interval.every == 10
    assert reaper.queue == "control" and reaper.enabled
    assert PeriodicTask.objects.filter(task="fleet.tasks.telemetry_rollup").exists()


def test_a_running_job_its_node_stops_listing_is_lost_after_the_grace(
    node: Node, owner: Any, team: Any
) -> None:
    job = running_job(node, owner, team)
    kept = running_job(node, owner, team)
    now = timezone.now()
    cache.delete_many([f"agents:missing:{job.pk}.1", f"agents:missing:{kept.pk}.1"])
    # The final report of `job` never arrived, and the agent no longer lists it.
    agent_heartbeat(node=node, running=[[kept.pk, 1, 1]], now=now)
    agent_heartbeat(node=node, running=[[kept.pk, 1, 1]], now=now + timedelta(seconds=20))
    assert Job.objects.get(pk=job.pk).state == "running"  # a report may still be in flight
    agent_heartbeat(node=node, running=[[kept.pk, 1, 1]], now=now + timedelta(seconds=31))
    lost = Job.objects.get(pk=job.pk)
    assert (lost.state, lost.requeues) == ("pending", 1)
    assert "no longer runs it" in lost.state_reason
    assert Job.objects.get(pk=kept.pk).state == "running"


@pytest.mark.parametrize("left", ["float", "other dispatch"])
def test_a_missing_marker_left_for_another_dispatch_does_not_cut_the_grace_short(
    node: Node, owner: Any, team: Any, left: str
) -> None:
    # Markers live in Redis, which outlives a database made anew or restored from a backup,
    # where job ids and attempts repeat: a marker set long ago for "job N, attempt 1" of
    # that other database must not make this job N lost at its first unlisted heartbeat.
    job = running_job(node, owner, team)
    now = timezone.now()
    long_ago = (now - timedelta(seconds=600)).timestamp()
    stale: Any = long_ago if left == "float" else [long_ago, long_ago - 5]
    cache.set(f"agents:missing:{job.pk}.1", stale, timeout=300)
    agent_heartbeat(node=node, running=[], now=now)
    assert Job.objects.get(pk=job.pk).state == "running"  # the grace starts now
    agent_heartbeat(node=node, running=[], now=now + timedelta(seconds=31))
    assert Job.objects.get(pk=job.pk).state == "pending"  # and still ends


def test_a_draining_node_that_went_down_comes_back_draining(node: Node, staff: Any) -> None:
    from fleet.services.nodes import node_drain, node_resume

    node_drain(node=node, user=staff, reason="disk swap")
    later = timezone.now() + timedelta(seconds=node.heartbeat_timeout + 5)
    nodes_reap(now=later)
    node.refresh_from_db()
    assert node.state == "down"
    agent_heartbeat(node=node, running=[], now=later)
    node.refresh_from_db()
    assert node.state == "draining"
    node_resume(node=node, user=staff)
    node.refresh_from_db()
    assert (node.state, node.drain_requested) == ("up", False)
