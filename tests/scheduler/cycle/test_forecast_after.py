"""The ETA forecast runs after the cycle, outside the scheduler lock, writes only ETAs and
only to rows as the cycle left them, and counts as done only once written."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from fleet.models import Job
from scheduler.cycle import forecast as forecast_module
from scheduler.cycle import lock
from scheduler.cycle.forecast import forecast_after
from scheduler.cycle.runner import run_cycle, run_cycle_locked
from scheduler.cycle.snapshot_rows import KEPT
from scheduler.models import CycleRecord
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = pytest.mark.django_db


def _waiting_behind_a_running_job(owner: Any, team: Any) -> list[Job]:
    make_running(owner, team, make_node("sim-a", 1), [0], time_limit=3600)
    return [make_job(owner, team, time_limit=600) for _ in range(3)]


def _lock_free(results: list[bool]) -> None:
    try:
        with lock.cycle_lock() as acquired:
            results.append(acquired)
    finally:
        connection.close()


def test_the_forecast_runs_outside_the_lock_and_counts_once_written(
    owner: Any, team: Any, sent: list[Any], monkeypatch: Any
) -> None:
    jobs = _waiting_behind_a_running_job(owner, team)
    real = forecast_module.estimates_for
    free: list[bool] = []

    def estimates_checking_the_lock(*args: Any) -> Any:
        # Another worker (its own connection) can take the lock while the forecast runs.
        other = threading.Thread(target=lambda: _lock_free(free))
        other.start()
        other.join(timeout=30)
        assert not CycleRecord.objects.filter(timings__has_key="eta_ms").exists()
        return real(*args)

    monkeypatch.setattr(forecast_module, "estimates_for", estimates_checking_the_lock)
    record = run_cycle()
    assert free == [True]
    assert record is not None and "eta_ms" in record.timings
    assert record.timings["etas_written"] == 3
    assert "eta_ms" in CycleRecord.objects.get(pk=record.pk).timings
    now = timezone.now().timestamp()
    etas = [Job.objects.get(pk=j.pk).eta for j in jobs]
    assert all(eta is not None for eta in etas)
    # No history: the first in line starts when the running job's hour is up.
    assert min(e.timestamp() for e in etas if e) == pytest.approx(now + 3600, abs=5)


def test_a_worker_killed_before_the_forecast_leaves_it_to_the_next_cycle(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    jobs = _waiting_behind_a_running_job(owner, team)
    record, forecast = run_cycle_locked()
    assert forecast is not None  # the worker dies here, before the forecast
    assert "eta_ms" not in CycleRecord.objects.get(pk=record.pk).timings
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], eta__isnull=False).count() == 0
    again = run_cycle()
    assert again is not None and "eta_ms" in again.timings
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], eta__isnull=False).count() == 3


def test_a_forecast_never_writes_over_newer_state_and_a_duplicate_writes_nothing(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    first, second, third = _waiting_behind_a_running_job(owner, team)
    _, forecast = run_cycle_locked()
    assert forecast is not None
    # Meanwhile a newer forecast gave the first job an ETA, and the second was held.
    newer = timezone.now() + timedelta(minutes=7)
    Job.objects.filter(pk=first.pk).update(eta=newer)
    Job.objects.filter(pk=second.pk).update(state="held")
    assert forecast_after(forecast) == 1
    assert Job.objects.get(pk=first.pk).eta == newer
    assert Job.objects.get(pk=second.pk).eta is None
    assert Job.objects.get(pk=third.pk).eta is not None
    # The same forecast again (a duplicated task) finds every row moved on: nothing twice.
    assert forecast_after(forecast) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row versions are PostgreSQL's")
def test_on_postgres_the_forecast_is_fenced_on_row_versions_and_keeps_them(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    KEPT.clear()
    try:
        first, second, third = _waiting_behind_a_running_job(owner, team)
        _, forecast = run_cycle_locked()
        assert forecast is not None and KEPT.versions  # the cycle kept its rows
        Job.objects.filter(pk=first.pk).update(priority=5)  # any write makes a new version
        assert forecast_after(forecast) == 2
        assert Job.objects.get(pk=first.pk).eta is None
        assert Job.objects.filter(pk__in=[second.pk, third.pk], eta__isnull=False).count() == 2
        assert forecast_after(forecast) == 0
    finally:
        KEPT.clear()
