"""The production snapshot carries what gittins and las need: the size distributions of
recent finished jobs and the service that requeued jobs already received."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from fleet.models import JobEvent
from fleet.services.job_states import SCHEDULER, Actor, job_transition
from scheduler.core.service_distribution import MIN_SAMPLES
from scheduler.cycle.snapshot import build_snapshot
from tests.scheduler.cycle.conftest import make_job, make_node

pytestmark = pytest.mark.django_db


def test_finished_jobs_give_the_size_and_limit_ratio_distributions(owner: Any, team: Any) -> None:
    now = timezone.now()
    for i in range(MIN_SAMPLES + 5):
        runtime = 100.0 * (i + 1)
        make_job(
            owner, team, gpus=2, time_limit=4000, state="succeeded",
            started_at=now - timedelta(seconds=runtime), finished_at=now,
        )  # fmt: skip
    core = build_snapshot(save_usage=False).core
    sizes, ratios = core.service_distribution, core.limit_ratio_distribution
    assert sizes and ratios
    # Sizes are GPU-seconds (2 GPUs x runtime); ratios are runtime / time limit.
    assert min(sizes) >= 2 * 100.0 - 1 and max(sizes) <= 2 * 100.0 * (MIN_SAMPLES + 5) + 1
    assert 0 < min(ratios) and max(ratios) <= 1.0


def test_without_history_the_distributions_are_empty(owner: Any, team: Any) -> None:
    core = build_snapshot(save_usage=False).core
    assert core.service_distribution == () and core.limit_ratio_distribution == ()


def test_a_requeued_job_carries_the_service_of_its_earlier_attempts(owner: Any, team: Any) -> None:
    node = make_node("sim-a", 4)
    job = make_job(owner, team, gpus=2)
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER,
        fields={"node": node, "gpu_indices": [0, 1]},
    )  # fmt: skip
    job_transition(job_id=job.pk, action="start", actor=Actor.node("sim-a"), attempt=1)
    job_transition(job_id=job.pk, action="preempt", actor=SCHEDULER, attempt=1)
    # Make the first attempt's run 600 s long.
    events = JobEvent.objects.filter(job=job)
    started = events.get(to_state="running")
    events.filter(from_state="running").update(at=started.at + timedelta(seconds=600))
    pending = {p.id: p for p in build_snapshot(save_usage=False).core.pending}
    assert pending[job.pk].attained_service == pytest.approx(2 * 600.0, abs=1.0)
    fresh = make_job(owner, team)
    assert {p.id: p for p in build_snapshot(save_usage=False).core.pending}[
        fresh.pk
    ].attained_service == 0.0


def test_a_history_predicts_as_its_predictor_does_bit_for_bit() -> None:
    import random

    from scheduler.core.prediction import RuntimePredictor
    from scheduler.cycle.history import History

    rng = random.Random(3)
    predictor = RuntimePredictor()
    for _ in range(500):
        limit = rng.choice([600.0, 3600.0, 86400.0])
        predictor.update(
            str(rng.randrange(8)), f"run{rng.randrange(6)}", limit, rng.uniform(0, limit)
        )
    history = History(predictor)
    asked = [
        (rng.randrange(10), f"run{rng.randrange(9)}", rng.choice([0, 60, 601, 3600, 4000, 86399]))
        for _ in range(400)
    ]
    # Each owner and name is asked at several limits (3600 and 4000 share a class); the
    # answers are the predictor's own.
    for owner, name, limit in asked:
        assert history.predict(owner, name, limit) == predictor.predict(
            str(owner), name, float(limit)
        )
    assert len(history.ratios) < len(history.predictions)
    assert History(RuntimePredictor()).predict(1, "run0", 60) is None
