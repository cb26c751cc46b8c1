from dataclasses import replace

from scheduler.core.eta import estimate
from scheduler.core.eta_arrivals import Arrivals
from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, running, snap

RATIOS = (0.1, 0.3, 0.5, 0.8, 1.0)  # learned actual/limit: gittins ranks short limits first


def _queue():
    # One node of 2 GPUs, busy until 2000; a long job waits for it.
    s = snap(
        [node("a", 2)],
        [job(1, 2, submitted=900, limit=36000)],
        [running(8, "a", (0, 1), started=0, limit=2000)],
        now=1000.0,
    )
    return replace(s, limit_ratio_distribution=RATIOS)


def _short_submissions():
    # An hour ago a short 2-GPU job was submitted at -2000: replayed, it comes at 1600.
    short = job(50, 2, submitted=-2000, limit=600, predicted_runtime=300)
    return Arrivals.from_submissions(1000.0, [short, job(51, 1, submitted=-5000)], 3600.0)


def test_a_short_job_expected_later_goes_ahead_under_gittins_and_delays_the_forecast():
    s, arrivals = _queue(), _short_submissions()
    gittins = get_policy("gittins")
    assert estimate(s, gittins)[1][1] == 2000.0  # the queue alone: when job 8 ends
    # The short job expected at 1600 ranks ahead, runs 2000-2300 (its predicted 300 s),
    # then job 1 starts.
    played = estimate(s, gittins, arrivals=arrivals, runtimes="predicted")
    assert played[1][1] == 2300.0


def test_an_expected_job_the_policy_ranks_behind_does_not_delay_the_forecast():
    s, arrivals = _queue(), _short_submissions()
    assert estimate(s, get_policy("fcfs"), arrivals=arrivals)[1][1] == 2000.0


def test_an_expected_job_takes_free_gpus_only_once_submitted():
    # Nothing runs; the waiting job needs 2 GPUs of a 2-GPU node held by a job ending at
    # 1200. The short job expected at 1600 comes after that: it cannot delay job 1.
    s = replace(
        snap(
            [node("a", 2)],
            [job(1, 2, submitted=900, limit=36000)],
            [running(8, "a", (0, 1), started=0, limit=1200)],
            now=1000.0,
        ),
        limit_ratio_distribution=RATIOS,
    )
    out = estimate(s, get_policy("gittins"), arrivals=_short_submissions())
    assert out[1][1] == 1200.0
    assert set(out) == {1}  # expected jobs are not reported


def test_the_stream_replays_the_window_with_fresh_ids_and_is_capped():
    jobs = [job(7, submitted=100.0, attained_service=50.0), job(8, submitted=3000.0)]
    arrivals = Arrivals.from_submissions(3500.0, jobs, 3600.0, max_arrivals=5)
    stream = list(arrivals.stream(3500.0, arrivals.templates()))
    assert [at for at, *_ in stream] == [3700.0, 6600.0, 7300.0, 10200.0, 10900.0]
    assert len({j.id for *_, j in stream}) == 5 and all(j.id < 0 for *_, j in stream)
    assert all(j.attained_service == 0.0 for *_, j in stream)
    # Submissions older than the window are not part of it.
    assert Arrivals.from_submissions(9000.0, jobs, 3600.0).recent == ()
