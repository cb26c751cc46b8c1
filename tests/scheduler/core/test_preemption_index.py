"""The cycle's victim index walks nodes from the cheapest victim up and asks which victims
are allowed only as it reaches them; it must choose exactly what `choose_victims` chooses
from the allowed list, ties and the node limit included."""

from __future__ import annotations

from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import preemption
from scheduler.core.placement import FreeCapacity
from scheduler.core.preemption import VictimIndex, cheapest_on_one_node, choose_victims
from scheduler.core.preemption_cost import PreemptionCost
from tests.scheduler.core.builders import frac, job, node, running, snap


@st.composite
def fleets(draw):
    """A few nodes, each GPU free, held whole by a running job, or shared by fractions;
    start times drawn from a handful of values, so that costs tie; node names not in fleet
    order, so that ties between nodes are broken by name, not by position."""
    nodes, run = [], []
    job_id = 1
    count = draw(st.integers(1, 6))
    for n in draw(st.permutations(range(count))):
        name = f"n{n}"
        gpus = draw(st.integers(1, 4))
        model = draw(st.sampled_from(("A100", "V100")))
        nodes.append(node(name, gpus, model=model, memory_mb=40960 if model == "V100" else 81920))
        g = 0
        while g < gpus:
            use = draw(st.sampled_from(("free", "whole", "whole", "fractions")))
            started = draw(st.sampled_from((0.0, 100.0, 400.0, 900.0)))
            if use == "whole":
                size = draw(st.integers(1, gpus - g))
                run.append(running(job_id, name, tuple(range(g, g + size)), started=started))
                job_id, g = job_id + 1, g + size
                continue
            if use == "fractions":
                for _ in range(draw(st.integers(1, 3))):
                    run.append(
                        running(
                            job_id,
                            name,
                            (g,),
                            gpus=0,
                            gpu_memory_mb=8192,
                            gpu_compute_percent=30,
                            started=draw(st.sampled_from((0.0, 100.0, 400.0))),
                        )
                    )
                    job_id += 1
            g += 1
    return nodes, run


def _choose(pending, s, allowed, max_nodes, cost):
    """`choose_victims` over the snapshot's free capacity, priced by `cost`."""
    return choose_victims(
        pending,
        FreeCapacity.from_snapshot(s),
        allowed,
        s.now,
        max_nodes=max_nodes,
        cost=cost.gpu_seconds,
    )


@settings(max_examples=300, deadline=None)
@given(
    fleet=fleets(),
    ask=st.sampled_from(("one", "two", "four", "fraction", "fraction-v100")),
    allowed_bits=st.lists(st.booleans(), min_size=40, max_size=40),
    max_nodes=st.integers(1, 4),
    restart=st.sampled_from((0.0, 60.0)),
)
def test_index_walk_chooses_what_choose_victims_chooses(
    fleet, ask, allowed_bits, max_nodes, restart
):
    nodes, run = fleet
    pending = {
        "one": job(100, 1),
        "two": job(100, 2),
        "four": job(100, 4),
        "fraction": frac(100, 20000, 60),
        "fraction-v100": frac(100, 20000, 60, gpu_model="V100"),
    }[ask]
    s = snap(nodes, [pending], run)
    cost = PreemptionCost(restart_overhead=restart)
    allowed = [r for r in run if allowed_bits[r.id % 40]]
    asked: list[int] = []

    def is_allowed(victim):
        asked.append(victim.id)
        return allowed_bits[victim.id % 40]

    expected = _choose(pending, s, allowed, max_nodes, cost)
    cap = FreeCapacity.from_snapshot(s)
    lost, _ = cost.columns(run, s.now)
    index = VictimIndex(run, lost.tolist(), cap, cost.gpu_seconds)
    found = cheapest_on_one_node(pending, cap, index, is_allowed, s.now, max_nodes=max_nodes)
    assert found == expected
    assert len(asked) == len(set(asked))  # each victim asked once at most


@settings(max_examples=300, deadline=None)
@given(
    fleet=fleets(),
    ask=st.sampled_from(("one", "two", "three", "four")),
    allowed_bits=st.lists(st.booleans(), min_size=40, max_size=40),
    max_nodes=st.integers(1, 6),
    restart=st.sampled_from((0.0, 60.0)),
)
def test_the_floor_that_skips_nodes_changes_no_choice(fleet, ask, allowed_bits, max_nodes, restart):
    """A node whose floor (the fewest victims that could free the GPUs still missing, at
    the cheapest victims' cost) is above the best set so far is not searched: the choice is
    the one a search of every node makes, and the floor is under every set it finds."""
    nodes, run = fleet
    pending = job(100, {"one": 1, "two": 2, "three": 3, "four": 4}[ask])
    s = snap(nodes, [pending], run)
    cost = PreemptionCost(restart_overhead=restart)
    allowed = [r for r in run if allowed_bits[r.id % 40]]
    searched: list[tuple[float, float]] = []
    real_on_node, real_floor = preemption.on_node, preemption.least_possible

    def on_node(job, k, cap, node, ordered, eligible, now, price, **kw):
        found = real_on_node(job, k, cap, node, ordered, eligible, now, price, **kw)
        if found is not None:
            floor = real_floor(k, cap, node, ordered, eligible, now, price)
            searched.append((floor, found.lost_gpu_seconds))
        return found

    def choose():
        return _choose(pending, s, allowed, max_nodes, cost)

    with patch.object(preemption, "least_possible", lambda *a: 0.0):
        with patch.object(preemption, "on_node", on_node):
            everywhere = choose()
    assert all(floor <= lost for floor, lost in searched)
    assert choose() == everywhere


def test_a_node_whose_floor_is_under_the_best_set_is_still_searched():
    """Node c is searched first (its cheapest victim loses least) and needs both its
    victims (2 + 7 GPU-seconds); node b needs two of its three (3 + 4 = 7 < 9), so its
    floor lets it be searched and it wins."""
    nodes = [node("c", 2), node("b", 3)]
    now = 1000.0
    run = [
        running(1, "c", (0,), started=now - 2),
        running(2, "c", (1,), started=now - 7),
        running(3, "b", (0,), started=now - 3),
        running(4, "b", (1,), started=now - 4),
        running(5, "b", (2,), started=now - 5),
    ]
    pending = job(100, 2)
    s = snap(nodes, [pending], run, now=now)
    found = choose_victims(pending, FreeCapacity.from_snapshot(s), run, now)
    assert found is not None
    assert (found.node, [v.id for v in found.jobs], found.lost_gpu_seconds) == ("b", [3, 4], 7.0)
