"""gavel: las's order, with each job placed on the GPU model where it runs best relative to
the other waiting jobs; speeds declared, learned per job class, or 1.0."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.policies import get_policy, policy_names
from scheduler.policies.gavel import SpeedLearner, plan_round, speed_key
from tests.scheduler.core.builders import job, node, running, snap

FAST, SLOW = "V100", "K80"
LM = ((FAST, 1.0), (SLOW, 0.05))  # barely runs on the slow model
A3C = ((FAST, 1.0), (SLOW, 0.5))  # loses half


def mixed(fast: int = 1, slow: int = 1):
    return [node("v", fast, model=FAST), node("k", slow, model=SLOW)]


def model_of(plan, job_id: int) -> str:
    place = next(p for p in plan.places if p.job_id == job_id)
    return {"v": FAST, "k": SLOW}[place.node]


def test_gavel_is_registered() -> None:
    assert "gavel" in policy_names()


def test_without_speeds_it_plans_exactly_as_las() -> None:
    pending = [job(i, 1 + i % 2, submitted=float(i)) for i in range(1, 9)]
    busy = [running(20, "v", (0,), started=0.0)]
    for s in (
        snap(mixed(4, 4), pending, busy, now=7200.0),
        snap(mixed(2, 1), pending, busy, now=20 * 3600.0),
    ):
        gavel, las = get_policy("gavel").schedule(s), get_policy("las").schedule(s)
        assert (gavel.places, gavel.preempts, gavel.order) == (las.places, las.preempts, las.order)


def test_the_job_that_loses_most_on_the_slow_model_gets_the_fast_one() -> None:
    # Job 1 is first in line; it loses less on the slow model than job 2, so it takes it.
    pending = [job(1, submitted=0.0, gpu_speeds=A3C), job(2, submitted=1.0, gpu_speeds=LM)]
    plan = get_policy("gavel").schedule(snap(mixed(), pending))
    assert (model_of(plan, 1), model_of(plan, 2)) == (SLOW, FAST)
    # las gives the first job in line the first GPU best fit finds, here the fast one.
    las = get_policy("las").schedule(snap(mixed(), pending))
    assert (model_of(las, 1), model_of(las, 2)) == (FAST, SLOW)


def test_a_job_alone_takes_its_fastest_model() -> None:
    plan = get_policy("gavel").schedule(snap(mixed(), [job(1, gpu_speeds=A3C)]))
    assert model_of(plan, 1) == FAST


def test_a_job_waits_rather_than_run_far_below_its_best_speed() -> None:
    busy = [running(9, "v", (0,))]
    # 0.05 of its best speed on the free model: by default it waits for the busy one.
    plan = get_policy("gavel").schedule(snap(mixed(1, 1), [job(1, gpu_speeds=LM)], busy))
    assert plan.places == ()
    assert "V100" in next(w.reason for w in plan.waits if w.job_id == 1)
    # Work-conserving with gavel_min_speed 0: it takes what is free.
    s = snap(mixed(1, 1), [job(1, gpu_speeds=LM)], busy, settings={"gavel_min_speed": 0})
    assert model_of(get_policy("gavel").schedule(s), 1) == SLOW
    # A3C runs at half speed on the slow model, above the bar: it starts there.
    plan = get_policy("gavel").schedule(snap(mixed(1, 1), [job(2, gpu_speeds=A3C)], busy))
    assert model_of(plan, 2) == SLOW


def test_learned_speeds_stand_in_for_undeclared_ones() -> None:
    pending = [job(1, name="a3c", submitted=0.0), job(2, name="lm", submitted=1.0)]
    table = {"a3c": dict(A3C), "lm": dict(LM)}
    base = snap(mixed(), pending)
    plan = get_policy("gavel").schedule(replace(base, gpu_speeds=table))
    assert (model_of(plan, 1), model_of(plan, 2)) == (SLOW, FAST)
    # The user's row when the job has no name.
    nameless = [job(1, user="alice"), job(2, user="bob", submitted=1.0)]
    learned = {"@alice": dict(A3C), "@bob": dict(LM)}
    plan = get_policy("gavel").schedule(replace(snap(mixed(), nameless), gpu_speeds=learned))
    assert (model_of(plan, 1), model_of(plan, 2)) == (SLOW, FAST)


def test_a_model_its_class_was_not_learned_on_is_not_risked() -> None:
    busy = [running(9, "v", (0,))]
    learned = {"lm": {FAST: 1.0, "P100": 0.7}}
    s = replace(snap(mixed(1, 1), [job(1, name="lm")], busy), gpu_speeds=learned)
    assert get_policy("gavel").schedule(s).places == ()
    # Two waiting jobs in one round: the unlearned model is nobody's choice.
    two = [job(1, name="lm"), job(2, name="lm", submitted=1.0)]
    assert get_policy("gavel").schedule(replace(snap(mixed(2, 1), two), gpu_speeds=learned)).places
    # A class not learned at all is placed as las places it.
    s = replace(snap(mixed(1, 1), [job(1, name="new")], busy), gpu_speeds=learned)
    assert model_of(get_policy("gavel").schedule(s), 1) == SLOW


def test_a_gang_takes_one_model_for_all_its_members() -> None:
    nodes = [node("v1", 2, model=FAST), node("k1", 2, model=SLOW), node("v2", 2, model=FAST)]
    gang = job(1, 4, gpus_per_node=2, gpu_speeds=A3C)
    plan = get_policy("gavel").schedule(snap(nodes, [gang]))
    (place,) = plan.places
    assert {m.node for m in place.allocations} == {"v1", "v2"}


def test_the_round_covers_the_head_of_the_queue_that_the_free_gpus_hold() -> None:
    pending = [job(i, submitted=float(i), gpu_speeds=A3C) for i in range(1, 6)]
    planned = plan_round(snap(mixed(1, 1), pending), pending)
    assert sorted(planned) == [1, 2]
    assert plan_round(snap([node("v", 2, model=FAST)], pending), pending) == {}


def test_the_learner_compares_runtimes_against_limits_per_class_and_model() -> None:
    learner = SpeedLearner(min_samples=2)
    for runtime, limit in ((100, 200), (400, 800)):
        learner.observe("train", FAST, runtime, limit)
        learner.observe("train", SLOW, runtime * 4, limit)
    learner.observe("other", FAST, 10, 100)
    table = learner.table()
    assert table["train"] == pytest.approx({FAST: 1.0, SLOW: 0.25})
    assert "other" not in table  # one model, one sample: nothing to compare
    assert learner.table() is table  # cached until the next observation
    assert speed_key("u", "") == "@u" and speed_key("u", "train") == "train"
