"""The submissions the production forecast expects again: every job submitted within the
window, whatever its state now."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleet.models import Job, JobState
from scheduler.cycle.eta_learning import recent_arrivals
from scheduler.cycle.snapshot import build_snapshot
from tests.scheduler.cycle.conftest import make_job

pytestmark = pytest.mark.django_db


def test_recent_arrivals_are_the_window_s_submissions_whatever_their_state(
    owner: Any, team: Any
) -> None:
    now = timezone.now()
    waiting = make_job(owner, team, gpus=2, time_limit=600, name="train")
    done = make_job(owner, team, gpus=1, time_limit=300, state=JobState.SUCCEEDED)
    old = make_job(owner, team, time_limit=900)
    Job.objects.filter(id=done.id).update(submitted_at=now - timedelta(hours=1))
    Job.objects.filter(id=old.id).update(submitted_at=now - timedelta(hours=10))

    arrivals = recent_arrivals(build_snapshot(save_usage=False), window=6 * 3600.0)

    assert [j.id for j in arrivals.recent] == [done.id, waiting.id]  # oldest first
    short, train = arrivals.recent
    assert (train.gpus, train.time_limit, train.name, train.team) == (2, 600.0, "train", team.slug)
    assert short.submitted_at == pytest.approx((now - timedelta(hours=1)).timestamp(), abs=1)
