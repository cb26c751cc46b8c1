"""The Tiresias baseline: two queues by attained GPU-time, FIFO inside a queue, promotion
against starvation, preemption between queues only."""

from __future__ import annotations

from dataclasses import replace

from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, running, snap

HOUR = 3600.0
BOUND = 16 * HOUR  # the default threshold, in GPU-seconds


def _plan(pending=(), run=(), nodes=None, now=100 * HOUR, **settings):
    s = snap(nodes or [node("a", 1)], pending, run, settings=settings, now=now)
    return get_policy("tiresias").schedule(s)


def test_high_queue_first_and_first_come_first_served_inside_a_queue():
    low = job(1, submitted=0.0, attained_service=20 * HOUR)
    fresh = job(2, submitted=100.0)
    # More attained than job 2 but under the threshold: same queue, and it came first
    # (least attained service would put job 2 ahead).
    some = job(3, submitted=50.0, attained_service=10 * HOUR)
    busy = running(9, "a", (0,), started=99 * HOUR)
    plan = _plan([low, fresh, some], [busy], tiresias_starve=0)
    assert plan.order == (3, 2, 1)
    assert (
        get_policy("las").schedule(snap([node("a", 1)], [low, fresh, some], [busy])).order[0] == 2
    )


def test_demotion_at_the_threshold_counts_gpus_times_time():
    fresh = [job(1, submitted=100.0)]
    # 4 GPUs for 4 h: 16 GPU-hours, low queue: a waiting job preempts it.
    wide = running(9, "a", (0, 1, 2, 3), started=0.0)
    nodes = [node("a", 4)]
    plan = _plan([job(1, 4, submitted=100.0)], [wide], nodes, now=4 * HOUR)
    assert [p.job_id for p in plan.preempts] == [9]
    assert "Tiresias" in plan.preempts[0].reason
    # One second short of the threshold: still in the high queue, it keeps running.
    plan = _plan([job(1, 4, submitted=100.0)], [wide], nodes, now=4 * HOUR - 1)
    assert plan.preempts == ()
    # 1 GPU for 4 h is 4 GPU-hours: high queue.
    narrow = running(9, "a", (0,), started=0.0)
    assert _plan(fresh, [narrow], now=4 * HOUR).preempts == ()
    # Earlier attempts count: 15 GPU-hours before and one hour now.
    again = replace(narrow, attained_service=15 * HOUR, started_at=3 * HOUR)
    assert [p.job_id for p in _plan(fresh, [again], now=4 * HOUR).preempts] == [9]
    # The threshold is a setting (GPU-hours).
    assert _plan(fresh, [again], now=4 * HOUR, tiresias_threshold=17).preempts == ()


def test_no_preemption_inside_a_queue():
    # Both in the low queue: the waiting one (submitted first) does not preempt.
    low_waiting = job(1, submitted=0.0, attained_service=20 * HOUR)
    low_running = running(9, "a", (0,), started=0.0, attained_service=20 * HOUR)
    assert _plan([low_waiting], [low_running], tiresias_starve=0).preempts == ()
    # Both in the high queue.
    high_running = running(9, "a", (0,), started=99 * HOUR)
    assert _plan([job(1)], [high_running]).preempts == ()
    # Switched off.
    assert _plan([job(1)], [low_running], tiresias_preemption=False).preempts == ()


def test_starved_job_is_promoted_after_starve_times_its_run_time():
    # Ran 2 h on one GPU over earlier attempts (2 GPU-hours attained with threshold 1),
    # requeued at hour 10: with STARVE 10 it is promoted at hour 10 + 20 = 30.
    starved = job(1, submitted=0.0, attained_service=2 * HOUR, queued_at=10 * HOUR)
    newcomer = job(2, submitted=29.5 * HOUR)
    busy = running(9, "a", (0,), started=29.9 * HOUR)
    settings = {"tiresias_threshold": 1}
    assert _plan([starved, newcomer], [busy], now=29.9 * HOUR, **settings).order == (2, 1)
    plan = _plan([starved, newcomer], [busy], now=30 * HOUR, **settings)
    # Promoted at hour 30, it enters the high queue behind the newcomer (FIFO by entry)...
    assert plan.order == (2, 1)
    assert any("1 waiting jobs promoted" in n for n in plan.notes)
    # ...and ahead of anyone who comes later.
    later = replace(newcomer, submitted_at=30.5 * HOUR)
    assert _plan([starved, later], [busy], now=31 * HOUR, **settings).order == (1, 2)
    # Guard off: it stays in the low queue.
    off = _plan([starved, later], [busy], now=31 * HOUR, tiresias_starve=0, **settings)
    assert off.order == (2, 1)


def test_promoted_job_keeps_the_high_queue_until_it_attains_the_threshold_again():
    # Requeued at hour 10 after 2 h of run, started again at hour 30 after its promotion.
    promoted = running(
        9, "a", (0,), started=30 * HOUR, attained_service=2 * HOUR, queued_at=10 * HOUR
    )
    fresh = [job(1, submitted=30.5 * HOUR)]
    settings = {"tiresias_threshold": 1}
    assert _plan(fresh, [promoted], now=30.5 * HOUR, **settings).preempts == ()
    # An hour into this attempt it has attained the threshold again: low queue.
    plan = _plan(fresh, [promoted], now=31 * HOUR, **settings)
    assert [p.job_id for p in plan.preempts] == [9]
    # Started before it had waited long enough: never promoted, low queue from the start.
    early = replace(promoted, started_at=20 * HOUR)
    assert [p.job_id for p in _plan(fresh, [early], now=20.5 * HOUR, **settings).preempts] == [9]


def test_no_per_job_cap_as_published_unless_set():
    churned = running(9, "a", (0,), started=0.0, attained_service=20 * HOUR, preemptions=50)
    assert [p.job_id for p in _plan([job(1)], [churned]).preempts] == [9]
    assert _plan([job(1)], [churned], tiresias_max_preemptions=3).preempts == ()
