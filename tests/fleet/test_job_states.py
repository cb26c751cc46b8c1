"""The state machine, exhaustively: every (action, state) pair either moves the job and
writes one event, or is refused and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.models import Job, JobEvent, JobState
from fleet.services.job_states import (
    SCHEDULER,
    TRANSITIONS,
    Actor,
    StaleAttempt,
    TransitionRefused,
    job_record_ignored,
    job_transition,
)
from tests.factories import JobFactory, NodeFactory

pytestmark = pytest.mark.django_db

ALL_STATES = [s.value for s in JobState]
CASES = [(action, state) for action in TRANSITIONS for state in ALL_STATES]


def _job_in(state: str, attempt: int = 1) -> Job:
    job = JobFactory()
    node = NodeFactory()
    # Test set-up only: put the row straight into the state under test.
    Job.objects.filter(id=job.id).update(
        state=state, attempt=attempt, node=node, gpu_indices=[0], requeues=0
    )
    job.refresh_from_db()
    return job


def _snapshot(job: Job) -> dict[str, Any]:
    return Job.objects.filter(id=job.id).values().get()


@pytest.mark.parametrize(("action", "state"), CASES)
def test_every_transition_is_applied_or_refused(action: str, state: str) -> None:
    transition = TRANSITIONS[action]
    job = _job_in(state)
    before = _snapshot(job)
    events_before = JobEvent.objects.filter(job=job).count()

    if state in transition.sources:
        updated = job_transition(job_id=job.id, action=action, actor=SCHEDULER, reason="why")
        assert updated.state == transition.target
        assert updated.state_reason == "why"
        event = JobEvent.objects.filter(job=job).latest("id")
        assert (event.from_state, event.to_state) == (state, transition.target)
        assert event.actor_kind == "scheduler"
        assert JobEvent.objects.filter(job=job).count() == events_before + 1
        if action == "dispatch":
            assert updated.attempt == before["attempt"] + 1
            assert event.attempt == updated.attempt
        else:
            assert updated.attempt == before["attempt"]
    else:
        with pytest.raises(TransitionRefused) as refused:
            job_transition(job_id=job.id, action=action, actor=SCHEDULER)
        assert f"is {state}; {action} applies only to" in refused.value.message
        assert _snapshot(job) == before
        assert JobEvent.objects.filter(job=job).count() == events_before


@pytest.mark.parametrize("action", sorted(TRANSITIONS))
def test_a_stale_attempt_changes_nothing(action: str) -> None:
    state = sorted(TRANSITIONS[action].sources)[0]
    job = _job_in(state, attempt=3)
    before = _snapshot(job)
    with pytest.raises(StaleAttempt) as stale:
        job_transition(job_id=job.id, action=action, actor=Actor.node("n1"), attempt=2)
    assert "attempt 3" in stale.value.message
    assert _snapshot(job) == before
    assert not JobEvent.objects.filter(job=job).exists()


def test_requeue_clears_placement_and_counts() -> None:
    job = _job_in(JobState.RUNNING)
    updated = job_transition(job_id=job.id, action="preempt", actor=SCHEDULER, reason="reclaimed")
    assert updated.state == JobState.PENDING
    assert updated.node is None and updated.gpu_indices == [] and updated.started_at is None
    assert updated.requeues == 1
    assert (updated.previous_state, updated.previous_attempt) == (JobState.RUNNING, 1)


def test_release_does_not_count_as_requeue() -> None:
    job = _job_in(JobState.HELD)
    assert job_transition(job_id=job.id, action="release", actor=SCHEDULER).requeues == 0


def test_ending_transitions_stamp_finished_at() -> None:
    job = _job_in(JobState.RUNNING)
    done = job_transition(
        job_id=job.id, action="fail", actor=Actor.node("n1"), attempt=1, fields={"exit_code": 3}
    )
    assert done.finished_at is not None and done.exit_code == 3


def test_duplicate_report_changes_nothing_twice() -> None:
    job = _job_in(JobState.RUNNING)
    job_transition(job_id=job.id, action="succeed", actor=Actor.node("n1"), attempt=1)
    after_first = _snapshot(job)
    with pytest.raises(TransitionRefused):
        job_transition(job_id=job.id, action="succeed", actor=Actor.node("n1"), attempt=1)
    assert _snapshot(job) == after_first
    assert JobEvent.objects.filter(job=job, applied=True).count() == 1


def test_ignored_reports_are_recorded_without_changing_state() -> None:
    job = _job_in(JobState.RUNNING, attempt=2)
    job_record_ignored(
        job_id=job.id, action="succeed", actor=Actor.node("n1"), attempt=1, why="stale"
    )
    event = JobEvent.objects.get(job=job)
    assert not event.applied
    assert event.from_state == event.to_state == JobState.RUNNING
    assert _snapshot(job)["state"] == JobState.RUNNING


def test_unknown_job_is_not_found() -> None:
    from fleet.errors import NotFound

    with pytest.raises(NotFound):
        job_transition(job_id=999999, action="hold", actor=SCHEDULER)


def test_dispatch_starts_moves_only_jobs_still_pending_on_the_decided_attempt() -> None:
    from fleet.services.job_batches import Dispatch, job_dispatch_starts

    fresh, held, stale = (
        _job_in(JobState.PENDING),
        _job_in(JobState.HELD),
        _job_in(JobState.PENDING),
    )
    node = NodeFactory()
    moved = job_dispatch_starts(
        dispatches=[
            Dispatch(fresh.id, 1, node.id, (0, 1), "placed on n"),
            Dispatch(held.id, 1, node.id, (2,), "placed on n"),
            Dispatch(stale.id, 0, node.id, (3,), "placed on n"),  # decided on an old attempt
        ],
        actor=SCHEDULER,
    )
    assert [s.job.id for s in moved] == [fresh.id]
    job = Job.objects.select_related("node").get(id=fresh.id)
    assert (job.state, job.attempt, job.node, job.gpu_indices) == ("assigned", 2, node, [0, 1])
    assert job.assigned_at is not None
    event = JobEvent.objects.get(job=fresh)
    assert (event.from_state, event.to_state, event.attempt, event.reason) == (
        "pending",
        "assigned",
        2,
        "placed on n",
    )
    assert event.at is not None
    for untouched, state in ((held, "held"), (stale, "pending")):
        row = Job.objects.get(id=untouched.id)
        assert (row.state, row.attempt) == (state, 1)
        assert not JobEvent.objects.filter(job=untouched).exists()
