"""The fast forms of the preemption costs give, to the bit, what the plain ones give:
`mean_residual` (atoms above the attained service and at the cap found by bisection)
against adding min(s, cap) - a over every atom above a, from the largest down; and
`PreemptionCost.columns` against `gpu_seconds` and `lost_gpu_seconds` job by job."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.model import RunningJob
from scheduler.core.preemption_cost import PreemptionCost, mean_residual, mean_residuals

SMALL = st.sampled_from([0.0, 1.0, 2.0, 5.0, 20.0])
NUMBERS = st.one_of(SMALL, st.floats(0.0, 1e6, allow_nan=False))


def _one_by_one(atoms: tuple[float, ...], attained: float, cap: float) -> float:
    a = max(0.0, attained)
    if cap <= a:
        return 0.0
    total, count = 0.0, 0
    for s in reversed(atoms):
        if s <= a:
            break
        total += min(s, cap) - a
        count += 1
    return total / count if count else min(a, cap - a)


@settings(max_examples=500, deadline=None)
@given(
    atoms=st.lists(NUMBERS, max_size=40).map(lambda xs: tuple(sorted(xs))),
    attained=st.one_of(NUMBERS, st.floats(-10.0, 0.0)),
    cap=st.one_of(NUMBERS, st.just(math.inf)),
    on_atom=st.booleans(),
)
def test_mean_residual_is_the_sum_one_by_one(atoms, attained, cap, on_atom) -> None:
    if on_atom and atoms:  # attained and cap on atoms (ties at both ends)
        attained, cap = atoms[0], atoms[-1]
    assert mean_residual(atoms, attained, cap) == _one_by_one(atoms, attained, cap)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.floats(0.0, 2e5, allow_nan=False),  # started at
            st.sampled_from([1, 2, 8, 0]),  # GPUs (0: a fraction)
            st.sampled_from([None, True, False]),  # says it checkpoints
        ),
        max_size=20,
    ),
    checkpoints=st.booleans(),
    interval=st.sampled_from([0.0, 1800.0, 7.5]),
    restart=st.sampled_from([0.0, 60.0, 0.1]),
    now=st.sampled_from([1e5, 2e5 + 0.3]),
)
def test_cost_columns_are_the_costs_one_by_one(rows, checkpoints, interval, restart, now) -> None:
    costs = PreemptionCost(
        restart_overhead=restart, checkpoints=checkpoints, checkpoint_interval=interval
    )
    jobs = [
        RunningJob(
            k, "t", "u", "n", (0,), started, 1e6, gpus=gpus, gpu_compute_percent=30,
            gpu_memory_mb=1024, checkpointed=said,
        )
        for k, (started, gpus, said) in enumerate(rows)
    ]  # fmt: skip
    cost, lost = costs.columns(jobs, now)
    assert cost.tolist() == [costs.gpu_seconds(j, now) for j in jobs]
    assert lost.tolist() == [costs.lost_gpu_seconds(j, now) for j in jobs]


@settings(max_examples=300, deadline=None)
@given(
    atoms=st.lists(st.one_of(NUMBERS, st.floats(1e6, 1e9)), max_size=60).map(
        lambda xs: tuple(sorted(xs))
    ),
    pairs=st.lists(
        st.tuples(
            st.one_of(NUMBERS, st.floats(-10.0, 0.0), st.floats(1e6, 1e9)),
            st.one_of(NUMBERS, st.just(math.inf), st.floats(1e6, 1e10)),
        ),
        min_size=1,
        max_size=12,
    ),
    on_atom=st.booleans(),
)
def test_mean_residuals_agree_with_mean_residual_up_to_rounding(atoms, pairs, on_atom) -> None:
    """The columns form the victim filters compare with a slack of 1e-9 of the values:
    it must stay far inside it, and be exact where nothing is summed."""
    if on_atom and atoms:
        pairs = [(atoms[len(atoms) // 2], cap) for _, cap in pairs]
    attained = np.array([a for a, _ in pairs], float)
    caps = np.array([c for _, c in pairs], float)
    found = mean_residuals(atoms, attained, caps)
    for k, (a, cap) in enumerate(pairs):
        expected = mean_residual(atoms, a, cap)
        assert math.isclose(found[k], expected, rel_tol=1e-12, abs_tol=1e-9), (a, cap)
        if cap <= max(a, 0.0) or not [s for s in atoms if s > max(a, 0.0)]:
            assert found[k] == expected  # nothing summed: the same operations
