"""The ILP at fleet scale: a model over classes of identical capacity, a packing term,
deterministic work limits, and a note whenever the plan is greedy's instead."""

from __future__ import annotations

import random

import pytest

from scheduler.core.model import GpuState, NodeState, PendingJob, Snapshot
from scheduler.policies import get_policy
from scheduler.policies.packing.ilp import IlpPolicy
from tests.scheduler.policies.test_packing_helpers import (
    check_plan,
    fraction,
    gang,
    idle_node,
)

KINDS = (("a100", 81_920), ("a100", 40_960), ("h100", 81_920), ("v100", 32_768))


def _fleet(nodes: int, seed: int, busy: float = 0.5) -> tuple[NodeState, ...]:
    """Nodes of 2, 4 or 8 GPUs of one kind each; about `busy` of the GPUs taken, some
    partly used by fractions in a few standard sizes."""
    rng = random.Random(seed)
    out = []
    for n in range(nodes):
        model, memory = rng.choice(KINDS)
        gpus = []
        for i in range(rng.choice((2, 4, 8, 8))):
            roll = rng.random()
            if roll < busy * 0.8:
                gpus.append(GpuState(i, model, memory, 0, 0))
            elif roll < busy:
                used = rng.choice((25, 50))
                gpus.append(GpuState(i, model, memory, memory * (100 - used) // 100, 100 - used))
            else:
                gpus.append(GpuState(i, model, memory, memory))
        out.append(NodeState(f"n{n:04d}", tuple(gpus)))
    return tuple(out)


def _queue(count: int, seed: int) -> tuple[PendingJob, ...]:
    rng = random.Random(seed + 1)
    jobs: list[PendingJob] = []
    for j in range(count):
        extra = {"submitted_at": float(j), "priority": rng.choice((0, 0, 1))}
        if rng.random() < 0.55:
            comp = rng.choice((10, 20, 25, 30, 50))
            jobs.append(fraction(j, rng.choice((8, 16, 20)) * 1024, comp, **extra))
        else:
            jobs.append(gang(j, rng.choice((1, 1, 1, 2, 4, 8)), **extra))
    return tuple(jobs)


def _snapshot(nodes: int, jobs: int, seed: int = 3) -> Snapshot:
    return Snapshot(now=3600.0, nodes=_fleet(nodes, seed), pending=_queue(jobs, seed))


def test_ilp_solves_on_a_fleet_of_1200_nodes_without_falling_back() -> None:
    snapshot = _snapshot(1200, 300)
    policy = IlpPolicy()
    plan = policy.schedule(snapshot)
    check_plan(snapshot, plan)
    assert not [n for n in plan.notes if "fell back" in n], plan.notes
    assert policy.last is not None and policy.last.status in ("optimal", "feasible")
    assert any(p.reason == "ilp" for p in plan.places)
    # Classes, not nodes: far fewer slot classes than nodes.
    assert policy.last.n_slot_classes < 100


def test_model_size_follows_distinct_shapes_not_node_count() -> None:
    def model_size(copies: int) -> int:
        nodes = tuple(
            NodeState(f"{base.name}-{c}", base.gpus)
            for c in range(copies)
            for base in _fleet(40, seed=5)
        )
        policy = IlpPolicy()
        policy.schedule(Snapshot(now=0.0, nodes=nodes, pending=_queue(60, 5)))
        assert policy.last is not None
        return policy.last.n_vars

    assert model_size(1) < 2_000
    assert model_size(50) <= model_size(1) * 1.5  # 2,000 nodes: the same shapes


def test_same_snapshot_gives_the_same_plan_and_the_same_solver_work() -> None:
    snapshot = _snapshot(400, 250, seed=11)
    first, again = IlpPolicy(), IlpPolicy()
    plan = first.schedule(snapshot)
    assert plan == again.schedule(snapshot)
    assert first.last is not None and again.last is not None
    assert (first.last.bb_nodes, first.last.simplex_iterations) == (
        again.last.bb_nodes,
        again.last.simplex_iterations,
    )


def _busy_and_idle() -> tuple[NodeState, ...]:
    busy = tuple(GpuState(i, "a100", 40_000, 0, 0) for i in range(6))
    busy += tuple(GpuState(i, "a100", 40_000, 40_000) for i in (6, 7))
    return (idle_node("idle", 8), NodeState("busy", busy))


@pytest.mark.parametrize("placement", ["fragmentation", "best_fit"])
def test_single_gpu_jobs_fill_a_partly_used_node_before_an_idle_one(placement: str) -> None:
    snapshot = Snapshot(
        now=0.0,
        nodes=_busy_and_idle(),
        pending=(gang(1, 1), gang(2, 1)),
        settings={"placement": placement},
    )
    plan = get_policy("ilp").schedule(snapshot)
    check_plan(snapshot, plan)
    assert {p.node for p in plan.places} == {"busy"}
    assert not plan.notes


@pytest.mark.parametrize("placement", ["fragmentation", "best_fit"])
def test_a_fraction_fills_a_partly_used_gpu_before_opening_a_free_one(placement: str) -> None:
    shared = GpuState(0, "a100", 40_000, 30_000, 60)
    snapshot = Snapshot(
        now=0.0,
        nodes=(NodeState("n0", (shared, GpuState(1, "a100", 40_000, 40_000))),),
        pending=(fraction(1, 10_000, 60),),
        settings={"placement": placement},
    )
    plan = get_policy("ilp").schedule(snapshot)
    check_plan(snapshot, plan)
    assert [(p.node, p.gpu_indices) for p in plan.places] == [("n0", (0,))]
    assert not plan.notes


def test_a_work_limit_with_no_solution_falls_back_with_a_note() -> None:
    snapshot = _snapshot(60, 80, seed=2)
    plan = get_policy("ilp", max_bb_nodes=0).schedule(snapshot)
    greedy = get_policy("greedy").schedule(snapshot)
    assert plan.places == greedy.places
    assert len(plan.notes) == 1
    assert plan.notes[0].startswith("ilp: fell back to greedy: no solution within the work limit")


_SOLVE_ONE = """
from scheduler.policies.packing._ilp_highs import IlpResult, Limits, Model, run_highs

m = Model()
a, b = m.col(1.0, -2.0), m.col(1.0, -1.0)
m.row([(a, 1.0), (b, 1.0)], 0.0, 1.0)
result = IlpResult(status="none", message="")
x = run_highs(m, Limits(), False, result)
assert x is not None and list(x) == [1.0, 0.0] and result.status == "optimal", (x, result)
"""


def test_a_solve_prints_nothing() -> None:
    # HiGHS prints a banner on a process's first call unless output is off before it; a
    # scheduler cycle writes nothing to the control worker's console. A fresh process, as
    # the banner comes once per process.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", _SOLVE_ONE], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""
