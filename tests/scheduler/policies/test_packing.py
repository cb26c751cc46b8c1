"""Hand-made cases for the packing policies: where the ILP beats best fit, fractional
memory and compute, gangs against fractions, quotas, the ILP's fallback to greedy, and
the order searches' determinism."""

from __future__ import annotations

import random

import pytest

from scheduler.core.model import GpuState, NodeState, RunningJob, Snapshot, TeamState
from scheduler.policies import get_policy
from scheduler.policies.packing._values import job_values
from tests.scheduler.policies.test_packing_helpers import (
    PACKING,
    check_plan,
    fraction,
    gang,
    idle_node,
    plan_value,
)


def _policy(name: str, **params: object):
    if name in ("genetic", "annealing"):
        params.setdefault("seed", 1)
    return get_policy(name, **params)


def _partly_busy(name: str, size: int, busy: int) -> NodeState:
    gpus = [GpuState(i, "a100", 40_000, 0, 0) for i in range(busy)]
    gpus += [GpuState(i, "a100", 40_000, 40_000) for i in range(busy, size)]
    return NodeState(name, tuple(gpus))


def _fools_best_fit() -> Snapshot:
    # 5 and 4 free GPUs; gangs of 3, 3, 2, 2, 2. Best fit, largest first, puts a 3 on the
    # 4-node and strands a GPU there (3+3+2 = 8); 3+2 and 2+2 would use all 9.
    nodes = (_partly_busy("n0", 8, 3), _partly_busy("n1", 8, 4))
    jobs = (gang(1, 3), gang(2, 3), gang(3, 2), gang(4, 2), gang(5, 2))
    return Snapshot(now=0.0, nodes=nodes, pending=jobs)


def test_ilp_places_more_value_than_best_fit_where_best_fit_strands_gpus() -> None:
    snapshot = _fools_best_fit()
    values = job_values(snapshot, {})
    assert set(values.values()) == {3.0, 2.0}  # equal weights: value is GPUs placed
    greedy = get_policy("greedy").schedule(snapshot)
    ilp = get_policy("ilp").schedule(snapshot)
    check_plan(snapshot, greedy)
    check_plan(snapshot, ilp)
    assert plan_value(greedy, values) == 8.0
    assert plan_value(ilp, values) == 9.0
    assert len(greedy.waits) == 2 and len(ilp.waits) == 1
    assert "needs 2 GPUs on one node" in greedy.waits[0].reason


@pytest.mark.parametrize("name", ["genetic", "annealing"])
def test_order_search_finds_the_order_that_packs_best(name: str) -> None:
    snapshot = _fools_best_fit()
    plan = _policy(name).schedule(snapshot)
    check_plan(snapshot, plan)
    assert plan_value(plan, job_values(snapshot, {})) == 9.0


def test_greedy_keeps_whole_nodes_free_for_large_gangs() -> None:
    # A first fit would put the 2-GPU job on the idle node and leave no room for the 8.
    snapshot = Snapshot(
        now=0.0,
        nodes=(idle_node("idle", 8), _partly_busy("busy", 8, 6)),
        pending=(gang(1, 2, priority=1), gang(2, 8)),
    )
    plan = get_policy("greedy").schedule(snapshot)
    check_plan(snapshot, plan)
    where = {p.job_id: p.node for p in plan.places}
    assert where == {1: "busy", 2: "idle"}


def test_greedy_puts_fractions_on_partly_used_gpus_first() -> None:
    partly = GpuState(0, "a100", 40_000, 30_000, 60)
    snapshot = Snapshot(
        now=0.0,
        nodes=(NodeState("n0", (partly, GpuState(1, "a100", 40_000, 40_000))),),
        pending=(fraction(1, 10_000, 50),),
    )
    plan = get_policy("greedy").schedule(snapshot)
    assert [(p.node, p.gpu_indices) for p in plan.places] == [("n0", (0,))]


@pytest.mark.parametrize("name", PACKING)
@pytest.mark.parametrize(
    ("first", "second", "short"),
    [
        ((30_000, 10), (20_000, 10), "MB"),  # compute would allow both; memory does not
        ((5_000, 60), (5_000, 60), "%"),  # memory would allow both; compute does not
    ],
)
def test_fractions_share_a_gpu_only_within_memory_and_compute(
    name: str, first: tuple[int, int], second: tuple[int, int], short: str
) -> None:
    snapshot = Snapshot(
        now=0.0,
        nodes=(idle_node("n0", 1),),
        pending=(fraction(1, *first), fraction(2, *second)),
    )
    plan = _policy(name).schedule(snapshot)
    check_plan(snapshot, plan)
    assert len(plan.places) == 1 and len(plan.waits) == 1
    assert short in plan.waits[0].reason


@pytest.mark.parametrize("name", PACKING)
def test_fractions_pack_into_gpus_when_paired_well(name: str) -> None:
    snapshot = Snapshot(
        now=0.0,
        nodes=(idle_node("n0", 2),),
        pending=(
            fraction(1, 30_000, 10),
            fraction(2, 20_000, 10),
            fraction(3, 5_000, 60),
            fraction(4, 5_000, 60),
        ),
    )
    plan = _policy(name).schedule(snapshot)
    check_plan(snapshot, plan)
    if name == "ilp":
        assert len(plan.places) == 4


@pytest.mark.parametrize("name", PACKING)
def test_a_gpu_holding_fractions_is_not_given_to_a_gang(name: str) -> None:
    snapshot = Snapshot(
        now=0.0,
        nodes=(idle_node("n0", 2),),
        pending=(gang(1, 2), fraction(2, 1_000, 30)),
    )
    plan = _policy(name).schedule(snapshot)
    check_plan(snapshot, plan)
    assert [p.job_id for p in plan.places] == [1]  # worth 2 GPUs against 0.3


def test_ilp_honours_team_hard_limit_and_user_cap() -> None:
    teams = {
        "t": TeamState("t", hard_limit_gpus=4),
        "s": TeamState("s", user_gpu_cap=2),
    }
    running = (RunningJob(900, "t", "u", "n9", (0,), 0.0, 3600.0),)
    snapshot = Snapshot(
        now=0.0,
        nodes=(idle_node("n0", 8), idle_node("n1", 8)),
        running=running,
        # Team t has 3 GPUs of room: 2 + 1, not 2 + 2. User v in s may add 2: one gang.
        pending=(
            gang(1, 2),
            gang(2, 2),
            gang(3, 1),
            gang(4, 2, team="s", user="v"),
            gang(5, 1, team="s", user="v"),
            gang(6, 1, team="s", user="v"),
        ),  # fmt: skip
        teams=teams,
    )
    plan = get_policy("ilp").schedule(snapshot)
    check_plan(snapshot, plan)
    by_team: dict[str, float] = {}
    for place in plan.places:
        job = next(j for j in snapshot.pending if j.id == place.job_id)
        by_team[job.team] = by_team.get(job.team, 0) + job.gpus
    assert by_team == {"t": 3, "s": 2}
    assert any("hard limit of 4" in w.reason for w in plan.waits)


def test_ilp_falls_back_to_greedy_when_the_solver_runs_out_of_time() -> None:
    snapshot = _fools_best_fit()
    plan = get_policy("ilp", time_limit=0).schedule(snapshot)
    greedy = get_policy("greedy").schedule(snapshot)
    check_plan(snapshot, plan)
    assert plan.places == greedy.places
    assert len(plan.notes) == 1
    assert "fell back to greedy" in plan.notes[0] and "time limit" in plan.notes[0]


@pytest.mark.parametrize(
    ("params", "settings", "words"),
    [
        ({"max_jobs": 3}, {}, "5 placeable jobs x 2 nodes is above the size limit (3 x 5000)"),
        ({}, {"ilp_max_nodes": 1}, "5 placeable jobs x 2 nodes is above the size limit (2000 x 1)"),
        ({"max_variables": 4}, {}, "above the size limit"),
    ],
)
def test_ilp_falls_back_to_greedy_above_the_size_limits(
    params: dict, settings: dict, words: str
) -> None:
    base = _fools_best_fit()
    snapshot = Snapshot(now=0.0, nodes=base.nodes, pending=base.pending, settings=settings)
    plan = get_policy("ilp", **params).schedule(snapshot)
    assert plan.places == get_policy("greedy").schedule(snapshot).places
    assert len(plan.notes) == 1 and "fell back to greedy" in plan.notes[0]
    assert words in plan.notes[0]


def _busy_fleet(seed: int, nodes: int = 12, jobs: int = 60) -> Snapshot:
    rng = random.Random(seed)
    fleet = []
    for n in range(nodes):
        gpus = []
        for i in range(8):
            roll = rng.random()
            if roll < 0.4:
                gpus.append(GpuState(i, "a100", 40_000, 0, 0))
            elif roll < 0.55:
                gpus.append(GpuState(i, "a100", 40_000, rng.randrange(5, 30) * 1000, 50))
            else:
                gpus.append(GpuState(i, "a100", 40_000, 40_000))
        fleet.append(NodeState(f"n{n:02d}", tuple(gpus)))
    pending = []
    for j in range(jobs):
        extra = {"priority": rng.randrange(3), "submitted_at": float(rng.randrange(3600))}
        if rng.random() < 0.3:
            pending.append(fraction(j, rng.randrange(1, 20) * 1000, rng.randrange(5, 60), **extra))
        else:
            pending.append(gang(j, rng.choice([1, 2, 3, 4, 5, 6, 8]), **extra))
    return Snapshot(now=3600.0, nodes=tuple(fleet), pending=tuple(pending))


@pytest.mark.parametrize("name", ["genetic", "annealing"])
def test_order_search_is_deterministic_for_a_seed_and_feasible(name: str) -> None:
    snapshot = _busy_fleet(seed=5)
    first = get_policy(name, seed=11).schedule(snapshot)
    again = get_policy(name, seed=11).schedule(snapshot)
    assert first == again
    check_plan(snapshot, first)
    values = job_values(snapshot, {})
    greedy = get_policy("greedy").schedule(snapshot)
    assert plan_value(first, values) >= plan_value(greedy, values)


@pytest.mark.parametrize("name", ["genetic", "annealing"])
def test_order_search_caps_the_jobs_it_searches_and_says_so(name: str) -> None:
    snapshot = _busy_fleet(seed=6)
    plan = get_policy(name, seed=2, max_jobs=5).schedule(snapshot)
    check_plan(snapshot, plan)
    assert any("searched orders of the 5 most valuable" in n for n in plan.notes)
