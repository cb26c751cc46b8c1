"""ETAs in the production cycle: the forecast is their one source, a job is forecast in the
first cycle it waits, and the band is learned from how forecasts turned out (kept in Redis)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from fleet.models import Job, JobState
from fleet.services.job_states import Actor, job_transition
from scheduler.cycle import eta_learning, forecast
from scheduler.cycle.config import settings_update
from scheduler.cycle.lock import redis_client
from scheduler.cycle.runner import run_cycle
from scheduler.models import CycleRecord
from tests.scheduler.cycle.conftest import make_job, make_node, make_running

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def clean_eta_keys() -> Any:
    client: Any = redis_client()

    def wipe() -> None:
        for key in client.scan_iter("fleet:eta:*"):
            client.delete(key)
        cache.delete(eta_learning.BAND_KEY)

    wipe()
    yield client
    wipe()


def _eta(job: Job) -> float:
    job.refresh_from_db()
    assert job.eta is not None
    return job.eta.timestamp()


def test_between_forecasts_the_stored_forecast_stays_and_a_new_job_is_forecast_at_once(
    owner: Any, team: Any, sent: list[Any]
) -> None:
    node = make_node("sim-a", 1)
    make_running(owner, team, node, [0], time_limit=3600)
    first = make_job(owner, team, time_limit=600)
    now = timezone.now().timestamp()
    run_cycle()
    assert CycleRecord.objects.latest("id").timings.get("eta_ms") is not None
    # No history: the running job is expected to use its whole hour.
    assert _eta(first) == pytest.approx(now + 3600, abs=5)

    # Within eta_interval, a cycle keeps the stored forecast; the reservation's start (from
    # time limits) is not a second source that overwrites it.
    earlier = timezone.now() + timedelta(minutes=30)
    Job.objects.filter(pk=first.pk).update(eta=earlier)
    run_cycle()
    assert "eta_ms" not in CycleRecord.objects.latest("id").timings
    assert _eta(first) == pytest.approx(earlier.timestamp(), abs=1)

    # A job that waits for the first time is forecast within a few seconds, not only at the
    # next eta_interval; right after a forecast it waits for that gap.
    second = make_job(owner, team, time_limit=600)
    run_cycle()
    assert "eta_ms" not in CycleRecord.objects.latest("id").timings
    second.refresh_from_db()
    assert second.eta is None
    run_cycle(now=timezone.now() + timedelta(seconds=forecast.NEW_JOB_FORECAST_GAP_S + 1))
    assert "eta_ms" in CycleRecord.objects.latest("id").timings
    assert _eta(second) == pytest.approx(now + 3600 + 600, abs=5)
    assert _eta(first) == pytest.approx(now + 3600, abs=5)


def test_the_band_learns_from_jobs_that_started_and_the_job_page_shows_it(
    owner: Any, team: Any, sent: list[Any], clean_eta_keys: Any
) -> None:
    settings_update(user=None, params={"eta_interval": 0})
    node = make_node("sim-a", 1)
    running = make_running(owner, team, node, [0], time_limit=3600)
    waiting = make_job(owner, team, time_limit=600)
    run_cycle()
    at, eta = (float(x) for x in clean_eta_keys.hget("fleet:eta:first", waiting.pk).split())
    assert eta - at == pytest.approx(3600, abs=5)

    page = Client()
    page.force_login(owner)
    html = page.get(f"/jobs/{waiting.pk}/").content.decode()
    assert "80% likely between" in html  # the default band until outcomes are learned

    # The running job ends early: the waiting job starts about an hour before its forecast.
    job_transition(job_id=running.pk, action="succeed", actor=Actor.node("sim-a"))
    run_cycle()
    waiting.refresh_from_db()
    assert waiting.state == JobState.ASSIGNED
    assert clean_eta_keys.hget("fleet:eta:first", waiting.pk) is None
    pairs = [json.loads(x) for x in clean_eta_keys.lrange(eta_learning.OUTCOMES_KEY, 0, -1)]
    assert len(pairs) == 1
    forecast_wait, actual_wait, judged, started_at = pairs[0]
    assert forecast_wait == pytest.approx(3600, abs=5) and actual_wait < 60 and not judged
    assert started_at == pytest.approx(at + actual_wait, abs=0.2)
    band = cache.get(eta_learning.BAND_KEY)
    assert band["samples"] == 1 and band["calibrated"] is False


def test_a_job_waiting_past_its_band_is_counted_a_miss_once(
    owner: Any, team: Any, sent: list[Any], clean_eta_keys: Any
) -> None:
    settings_update(user=None, params={"eta_interval": 0})
    node = make_node("sim-a", 1)
    make_running(owner, team, node, [0], time_limit=3600)
    late = make_job(owner, team, time_limit=600)
    # Told three hours ago that it would start within 100 s: far past the default band.
    at = timezone.now().timestamp() - 3 * 3600
    clean_eta_keys.hset("fleet:eta:first", late.pk, f"{at:.3f} {at + 100:.3f}")
    run_cycle()
    run_cycle()
    pairs = [json.loads(x) for x in clean_eta_keys.lrange(eta_learning.OUTCOMES_KEY, 0, -1)]
    assert pairs == [[100.0, None]]
    assert clean_eta_keys.hget("fleet:eta:first", late.pk).decode().endswith(" o")


def test_the_api_gives_the_band_with_the_eta_only_while_pending(
    owner: Any, team: Any, owner_api: Any, sent: list[Any]
) -> None:
    node = make_node("sim-a", 1)
    make_running(owner, team, node, [0], time_limit=3600)
    waiting = make_job(owner, team, time_limit=600)
    run_cycle()
    body = owner_api.get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert body["eta"] is not None
    low, high = body["eta_band"]
    assert low <= body["eta"] <= high and low < high
    listed = owner_api.get("/api/v1/jobs/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    listed_low, listed_high = next(j for j in rows if j["id"] == waiting.pk)["eta_band"]
    assert listed_low <= body["eta"] <= listed_high  # the band moves with the clock
    running = next(j for j in rows if j["state"] == "running")
    assert running["eta"] is None and running["eta_band"] is None


def test_first_forecasts_are_kept_once_and_dropped_after_the_horizon(
    clean_eta_keys: Any,
) -> None:
    calibration = eta_learning.EtaCalibration()
    now = 1_000_000.0
    first = {1: (None, now + 50, None), 2: (None, now + 80, None), 3: (None, None, None)}
    assert eta_learning.follow_forecasts(now, first, 3600, calibration) == 0
    kept = clean_eta_keys.hgetall("fleet:eta:first")
    assert kept == {b"1": b"1000000.000 1000050.000", b"2": b"1000000.000 1000080.000"}

    # A later forecast names other starts: the first ones stay; a new job is added.
    later = {1: (None, now + 900, None), 2: (None, now + 900, None), 4: (None, now + 990, None)}
    eta_learning.follow_forecasts(now + 30, later, 3600, calibration)
    kept = clean_eta_keys.hgetall("fleet:eta:first")
    assert kept[b"1"] == b"1000000.000 1000050.000"
    assert kept[b"4"] == b"1000030.000 1000990.000"

    # Past the horizon: job 2 (still waiting, far past its band) is counted a miss and
    # forgotten; job 1 (no longer waiting) is forgotten without a miss.
    misses = eta_learning.follow_forecasts(now + 3620, {2: later[2]}, 3600, calibration)
    assert misses == 1
    assert set(clean_eta_keys.hgetall("fleet:eta:first")) == {b"4"}
    outcomes = [json.loads(x) for x in clean_eta_keys.lrange(eta_learning.OUTCOMES_KEY, 0, -1)]
    assert outcomes == [[80.0, None]]


def test_jobs_still_waiting_on_their_first_forecasts_widen_the_published_band(
    clean_eta_keys: Any,
) -> None:
    # Thirty outcomes, all on time: the learned band is the forecast itself.
    calibration = eta_learning.EtaCalibration.from_outcomes([(600.0, 600.0)] * 30)
    now = 1_000_000.0
    at = now - 1800  # told 30 minutes ago that they would start in 10
    for job_id in range(1, 11):
        clean_eta_keys.hset("fleet:eta:first", job_id, f"{at:.3f} {at + 600:.3f}")
    waiting = {job_id: (None, now + 60, None) for job_id in range(1, 9)}  # 9, 10 started
    eta_learning.follow_forecasts(now, waiting, 3 * 3600, calibration)
    published = eta_learning.current_calibration()
    low, high = published.band(0.0, 600.0)
    assert low < 600.0 and high == pytest.approx(1800.0)


def test_a_wave_of_first_forecasts_outpacing_starts_widens_the_published_band(
    clean_eta_keys: Any,
) -> None:
    # Thirty outcomes, all on time (told 25 minutes, waited 25), the last six of them
    # started in the last half hour (forecast before it).
    now = 1_000_000.0
    outcomes = [(1500.0, 1500.0, False, now - 7200.0)] * 24
    outcomes += [(1500.0, 1500.0, False, now - 600.0)] * 6
    calm = eta_learning.EtaCalibration.from_outcomes(outcomes).band(0.0, 1500.0)
    # Ten jobs forecast at once: not more than twice the six starts, no wave.
    waiting = {job_id: (None, now + 1500, None) for job_id in range(1, 11)}
    calibration = eta_learning.EtaCalibration.from_outcomes(outcomes)
    eta_learning.follow_forecasts(now, waiting, 3 * 3600, calibration)
    assert eta_learning.current_calibration().band(0.0, 1500.0) == pytest.approx(calm)
    # Three more a minute later (thirteen shown in the last half hour, six starts): a wave.
    waiting.update({job_id: (None, now + 1560, None) for job_id in range(11, 14)})
    calibration = eta_learning.EtaCalibration.from_outcomes(outcomes)
    eta_learning.follow_forecasts(now + 60, waiting, 3 * 3600, calibration)
    low, high = eta_learning.current_calibration().band(0.0, 1500.0)
    assert low == pytest.approx(calm[0]) and high > 2 * calm[1]
    # The same, with fourteen jobs still waiting on forecasts of an hour ago: a queue that
    # stays long, not a wave after a quiet stretch.
    for job_id in range(100, 114):
        clean_eta_keys.hset("fleet:eta:first", job_id, f"{now - 3600:.3f} {now:.3f}")
        waiting[job_id] = (None, now + 600, None)
    calibration = eta_learning.EtaCalibration.from_outcomes(outcomes)
    eta_learning.follow_forecasts(now + 60, waiting, 3 * 3600, calibration)
    assert eta_learning.current_calibration().band(0.0, 1500.0) == pytest.approx(calm)


def test_jobs_first_forecast_long_after_their_submit_are_no_wave(clean_eta_keys: Any) -> None:
    # Redis lost the first forecasts: thirteen jobs submitted an hour ago are forecast
    # afresh. They are a queue that was there, not a wave of submissions.
    now = 1_000_000.0
    outcomes = [(1500.0, 1500.0, False, now - 7200.0)] * 30
    calm = eta_learning.EtaCalibration.from_outcomes(outcomes).band(0.0, 1500.0)
    waiting = {job_id: (None, now + 1500, None) for job_id in range(1, 14)}
    submitted = dict.fromkeys(waiting, now - 3600)
    calibration = eta_learning.EtaCalibration.from_outcomes(outcomes)
    eta_learning.follow_forecasts(now, waiting, 3 * 3600, calibration, submitted)
    assert eta_learning.current_calibration().band(0.0, 1500.0) == pytest.approx(calm)
    # Submitted just now, the same thirteen are one.
    clean_eta_keys.delete("fleet:eta:first")
    submitted = dict.fromkeys(waiting, now - 30)
    calibration = eta_learning.EtaCalibration.from_outcomes(outcomes)
    eta_learning.follow_forecasts(now, waiting, 3 * 3600, calibration, submitted)
    assert eta_learning.current_calibration().band(0.0, 1500.0)[1] > 2 * calm[1]
