"""`mean_residual` finds the atoms above the attained service and at the cap by bisection;
it gives, to the bit, what adding min(s, cap) - a over every atom above a, from the
largest down, gives."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.preemption_cost import mean_residual

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
