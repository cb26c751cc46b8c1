"""Batched stops (fleet.services.job_preemptions): the same result as one `job_transition`
and `stop_previous_attempt` per job, and a decision made on a stale read changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from fleet.models import GpuRelease, Job, JobEvent, JobMember, JobState, MemberState
from fleet.services.job_preemptions import Stop, job_stop_many
from fleet.services.job_states import SCHEDULER, job_transition
from fleet.services.jobs import stop_previous_attempt
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = pytest.mark.django_db


def _gang(owner: Any, team: Any, nodes: list[Any]) -> Job:
    """A running two-node job with its member rows (rank 0 on the job's own node)."""
    job = make_running(owner, team, nodes[0], [0, 1], gpus=4, gpus_per_node=2)
    for rank, node in enumerate(nodes):
        JobMember.objects.create(
            job=job, attempt=1, rank=rank, node=node, gpu_indices=[0, 1],
            state=MemberState.RUNNING,
        )  # fmt: skip
    return job


def _state(job: Job) -> dict[str, Any]:
    """What a stop leaves of a job, comparable across two jobs."""
    job.refresh_from_db()
    return {
        "row": (job.state, job.attempt, job.requeues, job.node_id, job.gpu_indices),
        "events": list(
            JobEvent.objects.filter(job=job).values_list("from_state", "to_state", "attempt")
        ),
        "holds": sorted(
            GpuRelease.objects.filter(job=job).values_list(
                "node__name", "attempt", "gpu_indices", "gpus", "cpus", "memory_mb"
            )
        ),
        "members": sorted(JobMember.objects.filter(job=job).values_list("rank", "state")),
    }


def test_a_batch_leaves_what_one_transition_and_stop_per_job_leave(
    owner: Any, team: Any, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    nodes = [make_node(f"sim-{c}", 4) for c in "abcd"]
    singles = [
        _gang(owner, team, nodes[:2]),
        make_running(owner, team, nodes[2], [3], cpus=4, memory_mb=1000),
    ]
    batched = [
        _gang(owner, team, nodes[2:]),
        make_running(owner, team, nodes[0], [3], cpus=4, memory_mb=1000),
    ]
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        for job in singles:
            moved = job_transition(
                job_id=job.pk, action="preempt", actor=SCHEDULER, reason="r", attempt=1
            )
            stop_previous_attempt(moved, reason="r")
    single_stops = [(q, m["job_id"]) for _, q, m in sent]
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        done = job_stop_many(
            stops=[Stop(j.pk, 1, "preempt", "r", for_job=None) for j in batched], actor=SCHEDULER
        )
    assert done == {batched[0].pk: None, batched[1].pk: None}
    for one, many in zip(singles, batched, strict=True):
        a, b = _state(one), _state(many)
        # (the jobs run on different nodes: compare what lies on them by shape)
        a["holds"] = [h[1:] for h in a["holds"]]
        b["holds"] = [h[1:] for h in b["holds"]]
        assert a == b
    assert _state(batched[0])["row"][0] == JobState.PENDING
    assert len(GpuRelease.objects.filter(job=batched[0])) == 2  # one per member's node
    # A stop message per member, to the node it runs on, as the single path sends them.
    batched_stops = [(q, m["job_id"]) for _, q, m in sent]
    assert len(batched_stops) == len(single_stops) == 3
    assert {q for q, _ in batched_stops} == {"node.sim-c", "node.sim-d", "node.sim-a"}


def test_stale_decisions_in_a_batch_change_nothing_and_say_why(
    owner: Any, team: Any, django_capture_on_commit_callbacks: Any
) -> None:
    node = make_node("sim-a", 4)
    fine = make_running(owner, team, node, [0])
    later = make_running(owner, team, node, [1])
    Job.objects.filter(pk=later.pk).update(attempt=2)
    queued = make_job(owner, team, gpus=1)
    before = timezone.now()
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        done = job_stop_many(
            stops=[
                Stop(fine.pk, 1, "fail", "no requeues left", for_job=queued.pk),
                Stop(later.pk, 1, "preempt", "r"),
                Stop(queued.pk, 0, "preempt", "r"),
                Stop(987654, 1, "preempt", "r"),
            ],
            actor=SCHEDULER,
        )
    assert done == {
        fine.pk: None,
        later.pk: f"Job {later.pk} is on attempt 2; this preempt was for attempt 1.",
        queued.pk: f"Job {queued.pk} is pending; preempt applies only to assigned or running jobs.",
        987654: "Job 987654 does not exist.",
    }
    fine.refresh_from_db()
    assert fine.state == JobState.FAILED and fine.finished_at >= before
    hold = GpuRelease.objects.get()
    assert (hold.job_id, hold.gpu_indices, hold.for_job_id) == (fine.pk, [0], queued.pk)
    later.refresh_from_db()
    assert (later.state, later.attempt, later.node_id) == (JobState.RUNNING, 2, node.pk)
    assert list(JobEvent.objects.values_list("job_id", "to_state")) == [(fine.pk, JobState.FAILED)]
    # The same stops again (a decision applied twice): nothing more moves.
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        again = job_stop_many(stops=[Stop(fine.pk, 1, "fail", "again")], actor=SCHEDULER)
    assert again[fine.pk] is not None and JobEvent.objects.count() == 1
    assert GpuRelease.objects.count() == 1


def test_a_member_already_being_released_keeps_its_hold(
    owner: Any, team: Any, django_capture_on_commit_callbacks: Any
) -> None:
    node = make_node("sim-a", 4)
    job = make_running(owner, team, node, [0, 1])
    expires = timezone.now() + timezone.timedelta(hours=1)
    GpuRelease.objects.create(
        node=node, job=job, attempt=1, gpu_indices=[0, 1], gpus=2, expires_at=expires
    )
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        assert job_stop_many(stops=[Stop(job.pk, 1, "preempt", "r")], actor=SCHEDULER) == {
            job.pk: None
        }
    assert GpuRelease.objects.get().expires_at == expires


def test_a_stop_on_a_down_node_holds_nothing_there(
    owner: Any, team: Any, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    node = make_node("sim-a", 4)
    job = make_running(owner, team, node, [0])
    node.state = "down"
    node.save()
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        job_stop_many(stops=[Stop(job.pk, 1, "preempt", "r")], actor=SCHEDULER)
    assert not GpuRelease.objects.exists()
    assert [(q, m["job_id"]) for _, q, m in sent] == [("node.sim-a", job.pk)]


def test_owners_who_asked_hear_of_their_jobs_preempted_or_failed(
    owner: Any, outsider: Any, team: Any, other_team: Any, monkeypatch: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:  # fmt: skip
    from fleet.models import Notification, NotificationSettings
    from fleet.services import notifications

    monkeypatch.setattr(notifications, "_enqueue", lambda notification_id: None)
    NotificationSettings.objects.create(user=owner, webhook_url="https://example.org/h")
    NotificationSettings.objects.create(user=outsider, webhook_url="https://example.org/o",
                                        on_requeue=False, on_failure=False)  # fmt: skip
    node = make_node("sim-a", 4)
    preempted = make_running(owner, team, node, [0])
    failed = make_running(owner, team, node, [1])
    quiet = make_running(outsider, other_team, node, [2])
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        job_stop_many(
            stops=[
                Stop(preempted.pk, 1, "preempt", "for job 9"),
                Stop(failed.pk, 1, "fail", "for job 9; not requeued"),
                Stop(quiet.pk, 1, "preempt", "for job 9"),
            ],
            actor=SCHEDULER,
        )
    assert sorted(Notification.objects.values_list("job_id", "event", "attempt")) == sorted(
        [(preempted.pk, "requeue", 1), (failed.pk, "failure", 1)]
    )
