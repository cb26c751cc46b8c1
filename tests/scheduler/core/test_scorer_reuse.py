"""A scorer is reused while the demand stays the same, and answers as a new one would."""

from __future__ import annotations

from scheduler.core._capacity_index import _KindIndex
from scheduler.core.fragmentation import DemandShape, Scorer

MIX = (
    (DemandShape(1), 0.5),
    (DemandShape(0, 25, 8192), 0.3),
    (DemandShape(2, gpu_model="V100"), 0.2),
)
A100, V100 = ("A100", 81920), ("V100", 32768)


def _kinds(*specs: tuple[tuple[str, int], int]) -> list[_KindIndex]:
    found = []
    for (model, mem), free in specs:
        ki = _KindIndex(model, mem, 8)
        ki.free = free
        found.append(ki)
    return found


def test_same_demand_same_scorer_and_its_answers() -> None:
    first = Scorer.for_demand(MIX)
    rise = first.fraction_partial(A100, 60, 40000, 25, 8192)
    again = Scorer.for_demand(tuple(MIX))  # equal, another object
    assert again is first and (1, A100, 60, 40000, 25, 8192) in again._memo
    fresh = Scorer(MIX)
    assert fresh.fraction_partial(A100, 60, 40000, 25, 8192) == rise
    assert fresh.whole(V100, 4, 2) == again.whole(V100, 4, 2)


def test_another_demand_another_scorer() -> None:
    first = Scorer.for_demand(MIX)
    other = Scorer.for_demand(((DemandShape(4), 1.0),))
    assert other is not first and other.demand == ((DemandShape(4), 1.0),)


def test_pressure_follows_the_kinds_it_is_asked_about() -> None:
    scorer = Scorer.for_demand(MIX)
    both = scorer.pressure(_kinds((A100, 800), (V100, 800)))
    only = scorer.pressure(_kinds((A100, 800)))
    assert only == Scorer(MIX).pressure(_kinds((A100, 800)))
    assert set(both) == {A100, V100} and set(only) == {A100}
