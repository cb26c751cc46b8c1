"""The Gittins-index policy: the index itself, queue order, preemption hysteresis."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.model import RunningJob, Snapshot, TeamState
from scheduler.core.preemption_cost import PreemptionCost
from scheduler.core.service_distribution import ServiceDistribution, bucket, summarize
from scheduler.policies import cycle_preempt, get_policy
from tests.scheduler.core.builders import job, node, running, snap
from tests.scheduler.invariants import assert_plan_valid
from tests.scheduler.policies.strategies import snapshots

# Sizes spread over five orders of magnitude (GPU-seconds): a heavy tail.
HEAVY = tuple(60.0 * 10**k for k in range(5) for _ in range(4))


# -- the index ---------------------------------------------------------------------------------


def test_index_on_a_hand_computed_distribution() -> None:
    dist = ServiceDistribution([2.0, 4.0, 12.0])
    # From 0: quantum 2 -> 1/3 finish, work (2 + 2 + 2)/3 -> ratio 1/6; quantum 4 -> 2/3 finish,
    # work (2 + 4 + 4)/3 -> 2/10; quantum 12 -> 3/18. The best quantum is 4.
    assert dist.index(0.0) == pytest.approx(0.2)
    # After 3: left are 1 and 9 -> quantum 1: (1/2) / ((1 + 1)/2) = 0.5.
    assert dist.index(3.0) == pytest.approx(0.5)
    # After 5 with a cap of 6 (its limit): the 12 moves to 6, one second left for sure.
    assert dist.index(5.0, cap=6.0) == pytest.approx(1.0)
    # Past every atom, no cap: it is assumed to need as much again.
    assert dist.index(20.0) == pytest.approx(1 / 20)
    assert dist.index(20.0, cap=30.0) == pytest.approx(1 / 10)


def test_the_cap_raises_the_index_of_jobs_close_to_their_limit() -> None:
    dist = ServiceDistribution(HEAVY)
    free = dist.index(600.0)
    capped = dist.index(600.0, cap=700.0)
    assert capped == pytest.approx(1 / 100)
    assert capped > free


def test_heavy_tail_index_falls_with_attained_service() -> None:
    dist = ServiceDistribution(HEAVY)
    values = [dist.index(a) for a in (0.0, 100.0, 1000.0, 10_000.0, 100_000.0)]
    assert values == sorted(values, reverse=True)
    assert values[0] > 10 * values[-1]


def test_summarize_keeps_the_mean_of_each_group() -> None:
    assert summarize(range(1, 41), points=4) == (5.5, 15.5, 25.5, 35.5)
    assert summarize(range(1, 10)) == ()  # too few to learn from
    assert summarize([0.0, -1.0, math.nan] + [5.0] * 20, points=2) == (5.0, 5.0)


def test_bucket_is_a_geometric_grid() -> None:
    assert bucket(10.0) == 0.0
    assert bucket(1024.0) == 1024.0
    assert 1024.0 <= bucket(1200.0) < 1200.0
    assert bucket(1200.0) == bucket(1210.0)


# -- the policy --------------------------------------------------------------------------------


def _snap(pending=(), running_jobs=(), nodes=None, now=10_000.0, **settings_kw) -> Snapshot:
    base = snap(nodes or [node("n1", 1)], pending, running_jobs, settings=settings_kw, now=now)
    return replace(base, service_distribution=HEAVY)


def test_order_prefers_less_attained_service_under_a_heavy_tail() -> None:
    old = job(1, submitted=0.0, limit=1e9, attained_service=50_000.0)
    new = job(2, submitted=5_000.0, limit=1e9)
    plan = get_policy("gittins").schedule(_snap([old, new]))
    assert plan.order == (2, 1)
    assert [p.job_id for p in plan.places] == [2]


def test_ties_go_in_submit_order() -> None:
    plan = get_policy("gittins").schedule(_snap([job(5, submitted=9.0), job(4, submitted=3.0)]))
    assert plan.order == (4, 5)


def _long_runner(started: float) -> object:
    # 20 GPU-hours attained before this attempt: deep in the tail.
    return running(9, "n1", (0,), started=started, limit=1e9, attained_service=72_000.0)


def test_preempts_a_long_runner_after_its_minimum_slice() -> None:
    plan = get_policy("gittins").schedule(_snap([job(1, limit=1e9)], [_long_runner(9_000.0)]))
    assert [p.job_id for p in plan.preempts] == [9]
    # The whole reason, the gain check's part included (written only for victims chosen).
    assert plan.preempts[0].reason == (
        "preempted for job 1: Gittins index 1/0.0833 GPU-h beats 1/148 GPU-h by more than "
        "0.5x; expected to need 146 GPU-h more against 37 GPU-h, which beats 8 x the "
        "preemption's cost of 0.294 GPU-h (60 s restart + 17 min of progress without a "
        "checkpoint)"
    )


def test_no_preemption_within_the_minimum_slice() -> None:
    plan = get_policy("gittins").schedule(_snap([job(1, limit=1e9)], [_long_runner(9_900.0)]))
    assert plan.preempts == ()
    shorter = get_policy("gittins", min_slice=60.0).schedule(
        _snap([job(1, limit=1e9)], [_long_runner(9_900.0)])
    )
    assert [p.job_id for p in shorter.preempts] == [9]


def test_no_preemption_without_the_margin() -> None:
    # A runner and a waiting job that attained as much have the same index: no preemption.
    runner = running(9, "n1", (0,), started=9_000.0, limit=1e9)
    waiting = job(1, limit=1e9, attained_service=1_000.0)
    plan = get_policy("gittins").schedule(_snap([waiting], [runner]))
    assert plan.preempts == ()
    # A margin larger than the gap between the two indices keeps the long runner too.
    dist = ServiceDistribution(HEAVY)
    gap = dist.index(0.0) / dist.index(bucket(72_000.0 + 1_000.0))
    wide = get_policy("gittins", margin=gap).schedule(
        _snap([job(1, limit=1e9)], [_long_runner(9_000.0)])
    )
    assert wide.preempts == ()
    assert (
        get_policy("gittins")
        .schedule(_snap([job(1, limit=1e9)], [_long_runner(9_000.0)], gittins_preemption=False))
        .preempts
        == ()
    )


def test_without_history_it_is_least_attained_service() -> None:
    base = snap(
        [node("n1", 1)],
        [job(1, submitted=0.0, attained_service=10_000.0), job(2, submitted=50.0)],
    )
    plan = get_policy("gittins").schedule(base)
    assert plan.order == (2, 1)
    assert any("no size history" in n for n in plan.notes)


# -- sizes as limit x GPUs x a learned ratio ----------------------------------------------------

RATIOS = (0.25, 0.5, 0.75, 1.0)


def _ratio_snap(pending=(), running_jobs=(), now=10_000.0) -> Snapshot:
    base = _snap(pending, running_jobs, now=now)
    return replace(base, limit_ratio_distribution=RATIOS)


def test_with_limit_ratios_the_index_scales_with_limit_times_gpus() -> None:
    # Ratios 1/4..1: from 0 the best quantum is the whole limit, 4 / (0.25+0.5+0.75+1) = 1.6,
    # per cap; a 1-hour 1-GPU job thus has index 1.6 / 3600 GPU-seconds.
    assert ServiceDistribution(RATIOS).index(0.0) == pytest.approx(1.6)
    short, wide, long = job(1, limit=3600.0), job(2, 2, limit=3600.0), job(3, limit=4 * 3600.0)
    plan = get_policy("gittins").schedule(_ratio_snap([long, wide, short]))
    assert plan.order == (1, 2, 3)
    assert [p.job_id for p in plan.places] == [1]


def test_with_limit_ratios_a_job_close_to_its_limit_keeps_running() -> None:
    # 50 min into a 1-hour limit: at most 10 minutes left, a fresh 1-hour job waits.
    near_end = running(9, "n1", (0,), started=10_000.0 - 3000.0, limit=3600.0)
    plan = get_policy("gittins").schedule(_ratio_snap([job(1, limit=3600.0)], [near_end]))
    assert plan.preempts == ()
    # Without the ratios the heavy-tailed sizes say a job 50 min in is a long one: its
    # index is lower...
    waiting = [job(1, limit=3600.0)]
    plain = get_policy("gittins").schedule(_snap(waiting, [near_end], preemption_gain_check=False))
    assert [p.job_id for p in plain.preempts] == [9]
    # ...but capped at its limit it has 10 minutes left at most, against 38 expected of the
    # fresh job: preempting it would not pay.
    assert get_policy("gittins").schedule(_snap(waiting, [near_end])).preempts == ()


def test_same_snapshot_same_plan() -> None:
    s = _snap(
        [
            job(i, submitted=float(i), limit=600.0 * i, attained_service=100.0 * (i % 3))
            for i in range(1, 9)
        ],
        [_long_runner(9_000.0)],
        nodes=[node("n1", 2), node("n2", 2)],
    )
    first = get_policy("gittins").schedule(s)
    policy = get_policy("gittins")
    assert policy.schedule(s) == first
    assert policy.schedule(s) == first


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshot=snapshots(),
    atoms=st.lists(st.floats(1.0, 1e7), min_size=1, max_size=30),
    ratios=st.lists(st.floats(0.001, 1.0), max_size=30),
)
def test_plan_keeps_invariants_with_a_distribution(
    snapshot: Snapshot, atoms: list[float], ratios: list[float]
) -> None:
    s = replace(
        snapshot,
        service_distribution=tuple(sorted(atoms)),
        limit_ratio_distribution=tuple(sorted(ratios)),
    )
    plan = get_policy("gittins").schedule(s)
    assert plan.policy == "gittins"
    assert_plan_valid(s, plan)


def _full_fleet_of_every_age(
    seed: int, teams: Mapping[str, TeamState] | None = None, **settings_kw: object
) -> Snapshot:
    """A full fleet of preemptible jobs of every age and a queue of small and large jobs
    (of teams a and b)."""
    teams = teams or {}
    import random

    rng = random.Random(seed)
    nodes = [node(f"n{i}", 8) for i in range(6)]
    runs, next_id = [], 100
    for n in nodes:
        g = 0
        while g < 8:
            size = min(rng.choice((1, 1, 2, 4)), 8 - g)
            runs.append(
                running(
                    next_id,
                    n.name,
                    tuple(range(g, g + size)),
                    team=rng.choice("ab"),
                    started=rng.uniform(0, 9_900),
                    limit=1e6,
                    attained_service=rng.choice((0.0, 600.0, 20_000.0, 200_000.0)),
                    priority=rng.choice((0, 0, 5)),
                )  # fmt: skip
            )
            next_id += 1
            g += size
    pending = [
        job(
            i,
            rng.choice((1, 1, 2, 8)),
            team=rng.choice("ab"),
            submitted=rng.uniform(0, 9_000),
            limit=1e6,
            attained_service=rng.choice((0.0, 0.0, 3_000.0)),
            priority=rng.choice((0, 0, 5)),
        )  # fmt: skip
        for i in range(1, 41)
    ]
    snapshot = _snap(pending, runs, nodes=nodes, gittins_min_slice=60.0, **settings_kw)
    return replace(snapshot, teams=MappingProxyType(dict(teams)))


@pytest.mark.parametrize("name", ["gittins", "gittins-tiers"])
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("short_list", [0, 4, 10**9])
def test_the_vectorised_victim_filter_preempts_exactly_as_the_rule_alone(
    name: str, seed: int, short_list: int
) -> None:
    """The numpy filter in front of the victim rule (settings "fast_paths") changes
    nothing in the plan, preemptions included, whether its lists are searched through the
    victim index (short_list 10**9: every list but an empty one) or asked about whole (0)."""
    snapshot = _full_fleet_of_every_age(seed)
    with patch.object(cycle_preempt, "SHORT_LIST", short_list):
        fast = get_policy(name).schedule(snapshot)
    plain = get_policy(name).schedule(_full_fleet_of_every_age(seed, fast_paths=False))
    assert fast.preempts, "the case must exercise preemption"
    assert fast == plain
    assert_plan_valid(snapshot, fast)


def test_a_search_that_lists_no_victim_walks_no_index() -> None:
    """gittins-tiers lists a job no victim when none is far enough behind it: such a
    search must not walk the victim index (every preemptible job) to find nothing; nor
    may a short list."""
    # Both teams within their guarantees (a job may reclaim; no team borrows), and every
    # running job started a second ago, inside its minimum slice: no victim is listed.
    fleet = _full_fleet_of_every_age(1, {t: TeamState(t, guaranteed_gpus=40) for t in ("a", "b")})
    fresh = tuple(replace(r, started_at=fleet.now - 1.0) for r in fleet.running)
    snapshot = replace(fleet, running=fresh)
    walked: list[tuple[int, int]] = []
    search = cycle_preempt.cheapest_on_one_node

    def counted(job: Any, cap: Any, index: Any, allowed: Any, now: float, **kw: Any) -> Any:
        asked = [0]

        def ask(victim: RunningJob) -> bool:
            asked[0] += 1
            return bool(allowed(victim))

        found = search(job, cap, index, ask, now, **kw)
        if found is None:
            walked.append((asked[0], len(index.order)))
        return found

    with patch.object(cycle_preempt, "cheapest_on_one_node", counted):
        plan = get_policy("gittins-tiers").schedule(snapshot)
    assert plan == get_policy("gittins-tiers").schedule(snapshot)
    # Searches through the index that found nothing asked about a share of it at most.
    assert all(asked * cycle_preempt.SHORT_LIST <= size for asked, size in walked), walked


# -- what a preemption may throw away ------------------------------------------------------------


def _wide_runner(ran: float, now: float = 50_000.0) -> RunningJob:
    # An 8-GPU job with a ten-day limit, `ran` seconds into its attempt: expected to need
    # months of GPU time more, by the ratios.
    return running(9, "n1", tuple(range(8)), started=now - ran, limit=864_000.0)


def _loss_snap(runner: RunningJob, now: float = 50_000.0, **settings_kw) -> Snapshot:
    # A 10-minute 1-GPU job waits for the full node.
    base = _snap([job(1, limit=600.0)], [runner], nodes=[node("n1", 8)], now=now, **settings_kw)
    return replace(base, limit_ratio_distribution=RATIOS)


def test_no_checkpoint_victim_is_not_preempted_when_it_would_lose_too_much() -> None:
    """5 hours on 8 GPUs (40 GPU-hours) would be thrown away for a job expected to need 6
    GPU-minutes: the exchange argument alone says it pays (the victim's remainder is a
    guess of thousands of GPU-hours), the loss bound says no."""
    now = 50_000.0
    runner = _wide_runner(5 * 3600.0)
    s = _loss_snap(runner)
    waiting_left = 600.0 * sum(RATIOS) / len(RATIOS)
    victim_left = 8 * 864_000.0 * 0.625
    costs = PreemptionCost.from_settings(s.settings)
    assert costs.loses_too_much(runner, now, waiting_left)
    # The rule before the bound: the gain check passes, the index beats the runner's.
    assert replace(costs, loss_bound=math.inf).pays(waiting_left, victim_left, runner, now)
    assert get_policy("gittins").schedule(s).preempts == ()
    assert get_policy("gittins-tiers").schedule(s).preempts == ()
    # Without the gain check (index rule only) it would go.
    assert [p.job_id for p in get_policy("gittins").schedule(
        _loss_snap(runner, preemption_gain_check=False)).preempts] == [9]  # fmt: skip


def test_loss_bound_lets_young_or_checkpointed_victims_go() -> None:
    # 6 minutes in: 0.8 GPU-hours lost, within 16 x 6 GPU-minutes.
    young = get_policy("gittins").schedule(_loss_snap(_wide_runner(360.0)))
    assert [p.job_id for p in young.preempts] == [9]
    assert "preemption's cost" in young.preempts[0].reason
    # Checkpointed continuously, 5 hours in: nothing is lost, the preemption pays.
    kept = get_policy("gittins").schedule(
        _loss_snap(_wide_runner(5 * 3600.0), preemption_checkpoints=True)
    )
    assert [p.job_id for p in kept.preempts] == [9]
    # The job's own word counts over the setting.
    said = replace(_wide_runner(5 * 3600.0), checkpointed=True)
    assert [p.job_id for p in get_policy("gittins").schedule(_loss_snap(said)).preempts] == [9]


def test_the_loss_bound_is_a_setting_and_zero_lifts_it() -> None:
    runner = _wide_runner(5 * 3600.0)
    assert get_policy("gittins").schedule(_loss_snap(runner)).preempts == ()
    # A bound large enough for 40 GPU-hours against 6 GPU-minutes lets it go...
    lifted = _loss_snap(runner, preemption_loss_bound=1e5)
    assert [p.job_id for p in get_policy("gittins").schedule(lifted).preempts] == [9]
    # ...and 0 means no bound at all, in the rule and in its numpy filter alike.
    for policy in ("gittins", "gittins-tiers"):
        unbounded = _loss_snap(runner, preemption_loss_bound=0)
        assert [p.job_id for p in get_policy(policy).schedule(unbounded).preempts] == [9]
    costs = PreemptionCost.from_settings({"preemption_loss_bound": 0})
    assert not costs.loses_too_much(runner, 50_000.0, 1.0)
