"""The fleet base brought up to date where nodes changed holds what one built afresh holds,
in the same order (what a search finds first depends on it)."""

from __future__ import annotations

import importlib
import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.model import GpuState, NodeState
from scheduler.core.placement import FreeCapacity
from scheduler.core.placement.fleet_base import FleetBase, fleet_base

_MODULE = importlib.import_module("scheduler.core.placement.fleet_base")


def _gpus(rng: random.Random, count: int, model: str, mem: int) -> tuple[GpuState, ...]:
    gpus = []
    for i in range(count):
        roll = rng.random()
        if roll < 0.4:
            gpus.append(GpuState(i, model, mem, mem))  # wholly free
        elif roll < 0.7:
            gpus.append(GpuState(i, model, mem, 0, free_compute_percent=0))  # taken
        else:
            used = rng.choice((10, 25, 50, 75))
            gpus.append(GpuState(i, model, mem, mem // 2, free_compute_percent=100 - used))
    return tuple(gpus)


def _node(rng: random.Random, name: str, count: int, model: str) -> NodeState:
    mem = 40960 if model == "V100" else 81920
    return NodeState(name, _gpus(rng, count, model, mem))


def _picture(cap: FreeCapacity) -> object:
    """Everything of the working copy a search reads, orders included."""
    kinds = {
        k: (
            [list(b) for b in ki.buckets],
            ki.bmask,
            [list(b) for b in ki.partial],
            ki.pmask,
            ki.whole_total,
            ki.free,
        )
        for k, ki in cap._kinds.items()
    }
    nodes = [(n.name, n.pos, n.mem, n.comp, n.whole) for n in cap._nodes]
    return kinds, nodes, cap._host, sorted(cap._by_index)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**20), rounds=st.integers(1, 6), size=st.integers(1, 30))
def test_updated_base_is_the_fresh_one(seed: int, rounds: int, size: int) -> None:
    rng = random.Random(seed)
    models = [rng.choice(("A100", "V100")) for _ in range(size)]
    counts = [rng.choice((2, 4, 8)) for _ in range(size)]
    nodes = tuple(_node(rng, f"n{i:02d}", counts[i], models[i]) for i in range(size))
    fleet_base(nodes)
    for _ in range(rounds):
        # Some nodes change (new objects: jobs started or ended on them), the rest are
        # the same objects, as the simulator's next snapshot holds them.
        changed = rng.sample(range(size), rng.randint(0, max(1, size // 5)))
        listed = list(nodes)
        for pos in changed:
            node = _node(rng, listed[pos].name, counts[pos], models[pos])
            listed[pos] = replace(node, schedulable=listed[pos].schedulable)
        flipped = rng.random() < 0.2
        if flipped:  # a node that stops taking work (or takes it again)
            pos = rng.randrange(size)
            listed[pos] = replace(listed[pos], schedulable=not listed[pos].schedulable)
        nodes = tuple(listed)
        kept = _MODULE._BASE[0]
        carried = FreeCapacity(nodes)
        if not flipped:
            assert _MODULE._BASE[0] is kept  # brought up to date, not built afresh
        fresh = FreeCapacity.__new__(FreeCapacity)
        base = FleetBase(nodes)  # built from every node, as a first cycle does
        assert _picture(carried) == _picture(_from(base, fresh, nodes))


def _from(base: FleetBase, cap: FreeCapacity, nodes: tuple[NodeState, ...]) -> FreeCapacity:
    saved = _MODULE._BASE[:]
    _MODULE._BASE[:] = [base]
    try:
        FreeCapacity.__init__(cap, nodes)
    finally:
        _MODULE._BASE[:] = saved
    return cap


def test_booking_on_a_working_copy_leaves_the_base_alone() -> None:
    rng = random.Random(3)
    nodes = tuple(_node(rng, f"n{i}", 8, "A100") for i in range(6))
    first = FreeCapacity(nodes)
    before = _picture(FreeCapacity(nodes))
    for name in first.nodes_with_whole_free(1)[:3]:
        first.take(_Whole(), name, first.whole_free(name)[:1])
    assert _picture(FreeCapacity(nodes)) == before


class _Whole:
    gpus = 1
    gpu_memory_mb = None
    gpu_compute_percent = None
    cpus = 0
    memory_mb = 0
