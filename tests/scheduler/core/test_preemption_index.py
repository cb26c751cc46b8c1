"""The cycle's victim index walks nodes from the cheapest victim up and asks which victims
are allowed only as it reaches them; it must choose exactly what `choose_victims` chooses
from the allowed list, ties and the node limit included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

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

    expected = choose_victims(
        pending,
        FreeCapacity.from_snapshot(s),
        allowed,
        s.now,
        max_nodes=max_nodes,
        cost=cost.gpu_seconds,
    )
    cap = FreeCapacity.from_snapshot(s)
    lost, _ = cost.columns(run, s.now)
    index = VictimIndex(run, lost.tolist(), cap, cost.gpu_seconds)
    found = cheapest_on_one_node(pending, cap, index, is_allowed, s.now, max_nodes=max_nodes)
    assert found == expected
    assert len(asked) == len(set(asked))  # each victim asked once at most
