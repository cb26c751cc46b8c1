"""Snapshots of one process keep the job objects and the learned history of the last one
where the database reads the same, and build new ones where anything differs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from fleet.models import Job
from scheduler.cycle.history import learn_history
from scheduler.cycle.snapshot import build_snapshot
from scheduler.cycle.snapshot_jobs import CARRIED
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = pytest.mark.django_db


def test_unchanged_jobs_keep_their_objects_and_changed_ones_get_new_ones(
    owner: Any, team: Any
) -> None:
    node = make_node("sim-a", 4)
    running = make_running(owner, team, node, [0, 1])
    kept, edited = make_job(owner, team), make_job(owner, team)
    first = build_snapshot(save_usage=False).core
    # The cycle writes a wait (reason, position, ETA): not something the policy reads.
    Job.objects.filter(pk=kept.pk).update(state_reason="waiting", queue_position=7)
    Job.objects.filter(pk=edited.pk).update(priority=5)
    new = make_job(owner, team)
    second = build_snapshot(save_usage=False).core
    before = {j.id: j for j in first.pending}
    after = {j.id: j for j in second.pending}
    assert after[kept.pk] is before[kept.pk]
    assert after[edited.pk] is not before[edited.pk] and after[edited.pk].priority == 5
    assert after[edited.pk] == type(after[edited.pk])(
        **{**_fields(before[edited.pk]), "priority": 5}
    )
    assert new.pk in after and new.pk not in before
    assert second.running[0] is first.running[0] and second.running[0].id == running.pk
    assert CARRIED.reused == 2  # the running job and the unchanged pending one

    Job.objects.filter(pk=running.pk).update(gpu_indices=[2, 3])
    third = build_snapshot(save_usage=False).core
    assert third.running[0] is not second.running[0]
    assert third.running[0].gpu_indices == (2, 3)
    assert {j.id for j in third.pending} == {kept.pk, edited.pk, new.pk}


def _fields(job: Any) -> dict[str, Any]:
    return {name: getattr(job, name) for name in type(job).__slots__}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="kept only on PostgreSQL")
def test_the_history_is_learned_again_only_when_finished_jobs_change(owner: Any, team: Any) -> None:
    now = timezone.now()
    done = [
        make_job(
            owner,
            team,
            name="train",
            state="succeeded",
            time_limit=3600,
            started_at=now - timedelta(seconds=600),
            finished_at=now,
        )
        for _ in range(3)
    ]
    first = learn_history(100)
    assert learn_history(100) is first
    short = first.predict(owner.pk, "train", 3600)
    assert short is not None and short < 3600
    # A finished job's row changes (its runtime): the history is learned again.
    Job.objects.filter(pk=done[0].pk).update(started_at=now - timedelta(seconds=3000))
    second = learn_history(100)
    assert second is not first
    longer = second.predict(owner.pk, "train", 3600)
    assert longer is not None and longer > short
    # Another job finishes.
    make_job(
        owner, team, name="train", state="timeout", time_limit=3600,
        started_at=now - timedelta(seconds=3600), finished_at=now,
    )  # fmt: skip
    third = learn_history(100)
    assert third is not second and learn_history(100) is third
    assert third.predictor.observations() == 4
