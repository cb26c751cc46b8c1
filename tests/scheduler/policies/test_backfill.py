from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, placed, running, snap, waits

# Node a: GPUs 0-1 busy until t=3600 (time limit), GPUs 2-3 free. Head needs all four.
RUN = [running(9, "a", (0, 1), started=0, limit=3600)]
HEAD = job(1, 4, submitted=0)


def _plan(*pending, settings=None):
    settings = {"backfill_order": "submit", **(settings or {})}
    return get_policy("backfill").schedule(
        snap([node("a", 4)], [HEAD, *pending], RUN, settings=settings)
    )


def test_head_gets_a_reservation_at_the_running_jobs_limit():
    plan = _plan()
    assert [(r.job_id, r.node, r.start, r.gpu_indices) for r in plan.reserves] == [
        (1, "a", 3600, (0, 1, 2, 3))
    ]
    wait = next(w for w in plan.waits if w.job_id == 1)
    assert wait.eta == 3600


def test_short_job_backfills_and_long_job_is_refused():
    short = job(2, 2, submitted=1, limit=2000)  # now 1000 + 2000 <= 3600
    long = job(3, 2, submitted=2, limit=5000)
    plan = _plan(short, long)
    assert placed(plan) == {2: ("a", (2, 3))}
    assert "reserved for job 1" in waits(plan)[3]
    assert plan.reserves == _plan().reserves  # the backfilled job did not move it
    assert _plan(long).places == ()


def test_long_job_runs_on_gpus_the_reservation_does_not_need():
    s = snap(
        [node("a", 4), node("b", 2)],
        [HEAD, job(3, 2, submitted=2, limit=99_999)],
        RUN,
        settings={"backfill_order": "submit"},
    )
    plan = get_policy("backfill").schedule(s)
    assert placed(plan) == {3: ("b", (0, 1))}
    assert [(r.node, r.start) for r in plan.reserves] == [("a", 3600)]


def test_reservation_uses_predictions_when_told():
    run = [running(9, "a", (0, 1), started=0, limit=3600, predicted_runtime=1800)]
    s = snap([node("a", 4)], [HEAD], run, settings={"backfill_use_predictions": True})
    assert get_policy("backfill").schedule(s).reserves[0].start == 1800
