"""gittins-tiers: priority tier, then quota tier, then the Gittins index."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.model import Plan, Snapshot
from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, running, snap, team
from tests.scheduler.invariants import assert_plan_valid
from tests.scheduler.policies.strategies import snapshots

# Sizes spread over five orders of magnitude (GPU-seconds): a heavy tail.
HEAVY = tuple(60.0 * 10**k for k in range(5) for _ in range(4))


def _snap(pending=(), running_jobs=(), nodes=None, teams=(), now=10_000.0, **kw) -> Snapshot:
    base = snap(nodes or [node("n1", 1)], pending, running_jobs, teams=teams, settings=kw, now=now)
    return replace(base, service_distribution=HEAVY)


def _long_runner(job_id: int = 9, **kw) -> object:
    # 20 GPU-hours attained before this attempt, started 1,000 s ago: gittins preempts it.
    return running(job_id, "n1", (0,), started=9_000.0, limit=1e9, attained_service=72_000.0, **kw)


def _decisions(plan: Plan) -> tuple:
    return plan.places, plan.preempts, plan.reserves, plan.waits, plan.order


def test_a_higher_priority_job_goes_first_whatever_its_index() -> None:
    # Job 1 has run 20 GPU-hours (a low index), job 2 is fresh (a high one).
    long = job(1, limit=1e9, attained_service=72_000.0, priority=5)
    fresh = job(2, limit=1e9)
    plan = get_policy("gittins-tiers").schedule(_snap([long, fresh]))
    assert plan.order == (1, 2)
    assert [p.job_id for p in plan.places] == [1]
    # gittins alone runs the fresh one.
    assert [p.job_id for p in get_policy("gittins").schedule(_snap([long, fresh])).places] == [2]


def test_a_higher_qos_goes_first_whatever_its_index() -> None:
    long = job(1, limit=1e9, attained_service=72_000.0, qos="high")
    fresh = job(2, limit=1e9, qos="normal")
    plan = get_policy("gittins-tiers").schedule(_snap([long, fresh]))
    assert [p.job_id for p in plan.places] == [1]


def test_a_team_beyond_its_guarantee_does_not_jump_one_within_it() -> None:
    # Team a already uses its 1 guaranteed GPU; team b uses none of its 1. a's waiting job is
    # fresh (a high index), b's has run long (a low one): b's goes first all the same.
    teams = [team("a", guaranteed_gpus=1), team("b", guaranteed_gpus=1)]
    nodes = [node("n1", 2)]
    busy = running(8, "n1", (0,), team="a", started=9_000.0)
    borrower = job(1, team="a", limit=1e9)
    within = job(2, team="b", limit=1e9, attained_service=72_000.0)
    plan = get_policy("gittins-tiers").schedule(
        _snap([borrower, within], [busy], nodes=nodes, teams=teams)
    )
    assert plan.order == (2, 1)
    assert [p.job_id for p in plan.places] == [2]
    gittins = get_policy("gittins").schedule(
        _snap([borrower, within], [busy], nodes=nodes, teams=teams)
    )
    assert [p.job_id for p in gittins.places] == [1]


def test_a_lower_tier_never_preempts_a_higher_one() -> None:
    # gittins preempts the long runner for a fresh job (test_gittins); not when the runner
    # has the higher priority...
    waiting = [job(1, limit=1e9)]
    plain = get_policy("gittins-tiers").schedule(_snap(waiting, [_long_runner()]))
    assert [p.job_id for p in plain.preempts] == [9]
    assert "Gittins index" in plain.preempts[0].reason
    high = get_policy("gittins-tiers").schedule(_snap(waiting, [_long_runner(priority=5)]))
    assert high.preempts == ()
    # ...nor when it runs within its team's guarantee and the waiting job's team borrows.
    teams = [team("a", guaranteed_gpus=1), team("b")]
    guarded = get_policy("gittins-tiers").schedule(
        _snap([job(1, team="b", limit=1e9)], [_long_runner(team="a")], teams=teams)
    )
    assert guarded.preempts == ()
    # A higher tier still preempts a lower one by the index.
    up = get_policy("gittins-tiers").schedule(
        _snap([job(1, limit=1e9, priority=5)], [_long_runner()])
    )
    assert [p.job_id for p in up.preempts] == [9]


def test_equal_tiers_reproduce_gittins_plan() -> None:
    pending = [
        job(i, submitted=float(i), limit=600.0 * i, attained_service=100.0 * (i % 3))
        for i in range(1, 9)
    ]
    s = _snap(pending, [_long_runner()], nodes=[node("n1", 2), node("n2", 2)])
    assert _decisions(get_policy("gittins-tiers").schedule(s)) == _decisions(
        get_policy("gittins").schedule(s)
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snapshot=snapshots(),
    atoms=st.lists(st.floats(1.0, 1e7), min_size=1, max_size=30),
    priority=st.integers(-5, 5),
    qos=st.sampled_from(["low", "normal", "high"]),
)
def test_one_tier_for_everyone_is_gittins(
    snapshot: Snapshot, atoms: list[float], priority: int, qos: str
) -> None:
    # Every job of one priority and QoS and no team with a guarantee: gittins' own plan.
    s = replace(
        snapshot,
        pending=tuple(replace(j, priority=priority, qos=qos) for j in snapshot.pending),
        running=tuple(replace(r, priority=priority, qos=qos) for r in snapshot.running),
        teams={k: replace(t, guaranteed_gpus=0) for k, t in snapshot.teams.items()},
        service_distribution=tuple(sorted(atoms)),
    )
    tiered = get_policy("gittins-tiers").schedule(s)
    assert tiered.policy == "gittins-tiers"
    assert_plan_valid(s, tiered)
    assert _decisions(tiered) == _decisions(get_policy("gittins").schedule(s))
