"""The production snapshot says when a job last entered the queue (tiresias' starvation guard
reads it) and whether its attempts resume from a checkpoint (what a preemption costs)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleet.models import Job, JobEvent
from fleet.services.job_reports import resumed_note
from fleet.services.job_states import SCHEDULER, Actor, job_transition
from scheduler.cycle.snapshot import build_snapshot
from scheduler.policies import get_policy
from tests.scheduler.cycle.conftest import make_job, make_node

pytestmark = pytest.mark.django_db


def _attempt(job: Job, node: Any, attempt: int, *, resumed: bool | None = None) -> None:
    """Dispatch and start the next attempt; the node says how it started."""
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [0]},
    )  # fmt: skip
    job_transition(
        job_id=job.pk,
        action="start",
        actor=Actor.node(node.name),
        attempt=attempt,
        reason=resumed_note(attempt, resumed),
    )


def _preempt(job: Job, attempt: int) -> None:
    job_transition(job_id=job.pk, action="preempt", actor=SCHEDULER, attempt=attempt)


def _snapshot():
    core = build_snapshot(save_usage=False).core
    return {j.id: j for j in core.pending}, {r.id: r for r in core.running}, core


def test_queued_at_is_when_the_job_last_entered_the_queue(owner: Any, team: Any) -> None:
    node = make_node("sim-a", 2)
    requeued = make_job(owner, team)
    _attempt(requeued, node, 1)
    _preempt(requeued, 1)
    requeued_at = JobEvent.objects.get(job=requeued, to_state="pending").at.timestamp()
    fresh = make_job(owner, team)
    pending, _, _ = _snapshot()
    assert pending[requeued.pk].queued_at == pytest.approx(requeued_at, abs=1e-3)
    assert pending[requeued.pk].queued_at > pending[requeued.pk].submitted_at
    assert pending[fresh.pk].queued_at == pytest.approx(pending[fresh.pk].submitted_at)
    # Running again: it entered the queue before this attempt at its requeue; a job never
    # requeued at its submit.
    _attempt(requeued, node, 2)
    _attempt(fresh, node, 1)
    _, running, _ = _snapshot()
    assert running[requeued.pk].queued_at == pytest.approx(requeued_at, abs=1e-3)
    fresh.refresh_from_db()
    assert running[fresh.pk].queued_at == pytest.approx(fresh.submitted_at.timestamp(), abs=1e-3)


def test_tiresias_promotes_by_the_wait_since_the_requeue(owner: Any, team: Any) -> None:
    # 600 s run on 1 GPU (above a 0.1 GPU-hour threshold: low queue), submitted a day ago,
    # requeued 100 s ago: it has waited 100 s, not the day, since it last ran.
    node = make_node("sim-a", 1)
    job = make_job(owner, team)
    _attempt(job, node, 1)
    _preempt(job, 1)
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(submitted_at=now - timedelta(days=1))
    events = JobEvent.objects.filter(job=job)
    events.filter(to_state="assigned").update(at=now - timedelta(seconds=800))
    events.filter(to_state="running").update(at=now - timedelta(seconds=700))
    events.filter(to_state="pending").update(at=now - timedelta(seconds=100))
    pending, _, core = _snapshot()
    assert pending[job.pk].attained_service == pytest.approx(600.0, abs=1.0)
    assert pending[job.pk].queued_at == pytest.approx(now.timestamp() - 100.0, abs=1.0)
    core = replace(core, settings={"tiresias_threshold": 0.1, "tiresias_starve": 10})
    assert not any("promoted" in n for n in get_policy("tiresias").schedule(core).notes)
    # Ten times its 600 s run after the requeue, it is promoted.
    later = replace(core, now=core.now + 6000.0)
    assert any("promoted" in n for n in get_policy("tiresias").schedule(later).notes)


def test_checkpointed_follows_how_the_attempts_started(owner: Any, team: Any) -> None:
    node = make_node("sim-a", 4)
    first_only = make_job(owner, team)
    _attempt(first_only, node, 1, resumed=False)
    resumes = make_job(owner, team)
    _attempt(resumes, node, 1, resumed=False)
    _preempt(resumes, 1)
    _attempt(resumes, node, 2, resumed=True)
    never = make_job(owner, team)
    _attempt(never, node, 1, resumed=False)
    _preempt(never, 1)
    _attempt(never, node, 2, resumed=False)
    silent = make_job(owner, team)
    _attempt(silent, node, 1)
    _preempt(silent, 1)
    _attempt(silent, node, 2)
    _, running, _ = _snapshot()
    # A first attempt always starts fresh: that says nothing yet.
    assert running[first_only.pk].checkpointed is None
    assert running[resumes.pk].checkpointed is True
    assert running[never.pk].checkpointed is False
    assert running[silent.pk].checkpointed is None
    # An earlier resume counts for the current attempt too.
    _preempt(resumes, 2)
    _attempt(resumes, node, 3, resumed=False)
    _, running, _ = _snapshot()
    assert running[resumes.pk].checkpointed is True
