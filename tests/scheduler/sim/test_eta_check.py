"""The simulator's ETA check: every job is forecast once when it first waits, and the
figures compare the forecast with the start it really had."""

from __future__ import annotations

from typing import Any

from scheduler.policies import get_policy
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.engine import simulate
from scheduler.sim.eta_check import EXACT, EtaDriver, eta_metrics
from scheduler.sim.state import SimConfig
from tests.scheduler.sim.conftest import job


def test_exact_runtimes_give_exact_etas_under_fcfs() -> None:
    # Time limits equal the runtimes and nothing else arrives: the forecast is the truth.
    jobs = [
        job(i, submit=i, duration=600.0 * (i + 1), time_limit=600.0 * (i + 1)) for i in range(6)
    ]
    driver = EtaDriver(get_policy("fcfs"))
    config = SimConfig(cycle_interval=60.0, plan_waits=True)
    result = simulate(jobs, parse_cluster("1x2xV100"), driver, config)
    m = eta_metrics(result, driver)
    assert m["eta_jobs"] == 6 and m["eta_waited"] == 4
    assert m["eta_median_abs_error_share"] < 0.01
    assert m["eta_none_share"] == 0.0


def test_padded_time_limits_make_etas_late_and_the_figure_shows_it() -> None:
    # Jobs ask for 4x their runtime and nothing predicts better: waits are overestimated.
    jobs = [job(i, submit=i, duration=600.0, time_limit=2400.0) for i in range(8)]
    driver = EtaDriver(get_policy("fcfs"))
    config = SimConfig(cycle_interval=60.0, plan_waits=True)
    result = simulate(jobs, parse_cluster("1x2xV100"), driver, config)
    m = eta_metrics(result, driver)
    assert m["eta_waited"] == 6
    assert m["eta_median_abs_error_share"] > 1.0


def test_told_the_true_runtimes_the_forecast_is_exact_however_padded_the_limits() -> None:
    # The jobs of the test above (limits 4x the runtime): told each job's true runtime, the
    # forecast has nothing left to get wrong under fcfs with nothing else arriving.
    jobs = [job(i, submit=i, duration=600.0 * (1 + i % 3), time_limit=2400.0) for i in range(8)]
    config = SimConfig(cycle_interval=60.0, plan_waits=True)
    driver = EtaDriver(get_policy("fcfs"), runtimes=EXACT)
    result = simulate(jobs, parse_cluster("1x2xV100"), driver, config)
    m = eta_metrics(result, driver)
    assert m["eta_waited"] == 6
    assert m["eta_p90_abs_error_share"] < 0.01
    predicted = EtaDriver(get_policy("fcfs"))
    m = eta_metrics(simulate(jobs, parse_cluster("1x2xV100"), predicted, config), predicted)
    assert m["eta_median_abs_error_share"] > 0.5


def test_the_forecasts_shown_while_jobs_wait_are_scored_on_the_wait_still_ahead() -> None:
    # Padded limits: every forecast is late, the first ones and those shown later alike.
    jobs = [job(i, submit=i, duration=600.0, time_limit=2400.0) for i in range(8)]
    config = SimConfig(cycle_interval=60.0, plan_waits=True)
    driver = EtaDriver(get_policy("fcfs"), shown_every=5)
    result = simulate(jobs, parse_cluster("1x2xV100"), driver, config)
    m = eta_metrics(result, driver)
    assert m["eta_shown_samples"] > m["eta_waited"]
    assert m["eta_shown_median_abs_error_share"] > 1.0
    none = EtaDriver(get_policy("fcfs"))
    assert (
        eta_metrics(simulate(jobs, parse_cluster("1x2xV100"), none, config), none)[
            "eta_shown_samples"
        ]
        == 0
    )


def test_the_driver_tells_the_band_the_pace_of_first_forecasts_and_starts() -> None:
    driver = EtaDriver(get_policy("fcfs"))
    driver._started_at.extend([0.0] * 5)  # five starts at 0
    driver._pace(60.0, 10)  # ten first forecasts shown at 60: not twice the starts
    assert not driver.calibration.wave
    driver._pace(120.0, 1)
    assert driver.calibration.wave
    # Half an hour on the starts at 0 no longer count, nor the forecasts at 60 soon after.
    driver._pace(1801.0, 0)
    assert driver.calibration.wave and len(driver._started_at) == 0
    driver._pace(1861.0, 0)
    assert not driver.calibration.wave and len(driver._shown_at) == 1
    # Jobs still waiting on forecasts of over half an hour ago: a long queue, not a wave.
    for job_id in range(12):
        driver.forecasts[job_id] = (0.0, 4000.0, 0.0, 5000.0, True)
        driver._open.add(job_id)
    driver._pace(1900.0, 11)
    assert not driver.calibration.wave
    driver._placed.update(range(6))  # placed by the plan that forecast them: no band
    driver._pace(1910.0, 0)
    assert driver.calibration.wave


def test_a_wave_ends_half_an_hour_on_even_when_no_job_is_new() -> None:
    # Twelve jobs at once on one GPU: a wave; two hours of queue follow with nothing new.
    jobs = [job(i, submit=0.0, duration=600.0, time_limit=600.0) for i in range(12)]
    driver = EtaDriver(get_policy("fcfs"))
    seen: list[tuple[float, bool]] = []
    cycle = driver.cycle

    def watched(state: Any) -> int:
        done = cycle(state)
        seen.append((state.now, driver.calibration.wave))
        return done

    driver.cycle = watched  # type: ignore[method-assign]
    config = SimConfig(cycle_interval=60.0, plan_waits=True)
    simulate(jobs, parse_cluster("1x1xV100"), driver, config)
    assert seen[0] == (0.0, True)
    assert all(wave for at, wave in seen if at < 1800.0)
    assert not any(wave for at, wave in seen if at >= 1800.0)
