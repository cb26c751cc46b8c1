from dataclasses import replace

import pytest

from scheduler.core.eta import estimate
from scheduler.core.eta_runtimes import Runtimes, quantile_of
from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, running, snap

# Finished jobs used 10%, 20%, ..., 100% of their limits (mean 55%).
RATIOS = tuple(i / 10 for i in range(1, 11))


def test_quantiles_are_fixed_per_job_and_spread_evenly():
    assert quantile_of(7) == quantile_of(7)
    deciles = [0] * 10
    for job_id in range(1, 101):
        deciles[int(quantile_of(job_id) * 10)] += 1
    assert min(deciles) >= 8 and max(deciles) <= 12


def test_a_waiting_job_is_played_at_its_predicted_runtime_unless_asked_otherwise():
    pending = job(1, limit=1000, predicted_runtime=550)
    assert Runtimes(RATIOS).runtime(pending) == 550
    # Its predicted share (55%) is the ratios' mean: the median atom is the sixth (60%).
    assert Runtimes(RATIOS, "median").runtime(pending) == pytest.approx(600)
    # Half the prediction: the ratios scaled by a half.
    half = replace(pending, predicted_runtime=275)
    assert Runtimes(RATIOS, "median").runtime(half) == pytest.approx(300)
    # Nothing learned, or no prediction: the predicted runtime (the limit without one).
    assert Runtimes((), "median").runtime(pending) == 550
    assert Runtimes(RATIOS, "median").runtime(replace(pending, predicted_runtime=None)) == 1000
    with pytest.raises(ValueError):
        Runtimes(RATIOS, "mean")


def test_spread_runtimes_average_to_the_prediction():
    played = Runtimes(RATIOS, "spread")
    runs = [played.runtime(job(i, limit=1000, predicted_runtime=550)) for i in range(1, 201)]
    assert sum(runs) / len(runs) == pytest.approx(550, rel=0.05)
    assert sorted(runs)[100] < 650 and min(runs) == pytest.approx(100)


def test_a_running_job_ends_at_the_median_of_what_it_may_still_use():
    # Ran 500 s of a 1,000 s limit: of the ratios above 50%, the median is 80%.
    r = running(8, "a", (0,), started=0, limit=1000, predicted_runtime=550)
    assert Runtimes(RATIOS, "median").end(r, 500.0) == pytest.approx(800)
    assert Runtimes(RATIOS).end(r, 500.0) is None  # predicted: the caller's rule


def _busy():
    # Four 1-GPU jobs started together, each predicted to use 55% of its 1,000 s; one more
    # waits for a GPU.
    run = [
        running(10 + i, "a", (i,), started=0, limit=1000, predicted_runtime=550) for i in range(4)
    ]
    s = snap([node("a", 4)], [job(1, limit=1000, submitted=0)], run, now=10.0)
    return replace(s, limit_ratio_distribution=RATIOS)


def test_the_forecast_plays_the_runtimes_asked_for():
    s = _busy()
    fcfs = get_policy("fcfs")
    # All four at the mean: the waiting job starts when they all end.
    assert estimate(s, fcfs)[1][1] == 550
    assert estimate(s, fcfs, runtimes="median")[1][1] == pytest.approx(600)
    # Spread: the four end at four different quantiles and the job takes the first GPU.
    spread = [Runtimes(RATIOS, "spread").end(r, 10.0) for r in s.running]
    assert len(set(spread)) == 4
    assert estimate(s, fcfs, runtimes="spread")[1][1] == pytest.approx(min(spread))


def test_several_draws_give_each_job_its_median_start():
    s = _busy()
    fcfs = get_policy("fcfs")
    draws = [estimate(s, fcfs, runtimes="spread", offset=k / 3)[1][1] for k in range(3)]
    assert estimate(s, fcfs, runtimes="spread", samples=3)[1][1] == sorted(draws)[1]


def test_gittins_forecasts_play_the_median_and_the_others_the_prediction():
    s = _busy()
    assert estimate(s, get_policy("gittins"))[1][1] == pytest.approx(600)
    assert estimate(s, get_policy("gittins-tiers"))[1][1] == pytest.approx(600)
    assert estimate(s, get_policy("priority"))[1][1] == 550
    assert estimate(s, get_policy("gittins"), runtimes="predicted")[1][1] == 550
