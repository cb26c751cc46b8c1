"""Every registered policy on a queue mixing multi-node gangs, one-node jobs and fractions,
on nodes that report host CPUs and memory: nothing over-booked, gangs whole or not at
all; and the invariant checker catches broken gang and host bookings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core.model import Member, Place, Plan, Wait
from scheduler.policies import policy_names
from tests.scheduler.core.builders import frac, job, node, snap, team
from tests.scheduler.invariants import assert_plan_valid, plan_violations
from tests.scheduler.policies.test_policy_properties import _policy_or_skip


def _hosted(name: str, gpus: int, cpus: int, memory_mb: int, group: str):
    return replace(
        node(name, gpus),
        cpus=cpus,
        memory_mb=memory_mb,
        free_cpus=cpus,
        free_memory_mb=memory_mb,
        group=group,
    )


NODES = [
    _hosted("r1a", 8, 64, 262144, "r1"),
    _hosted("r1b", 8, 64, 262144, "r1"),
    _hosted("r2a", 8, 16, 65536, "r2"),
    _hosted("r2b", 4, 64, 262144, "r2"),
]
QUEUE = [
    job(1, 16, gpus_per_node=8, cpus=32, memory_mb=131072, submitted=1),
    job(2, 2, cpus=8, submitted=2),
    frac(3, 20_000, 30, cpus=2, submitted=3),
    job(4, 8, gpus_per_node=4, cpus=16, same_group=True, submitted=4),
    job(5, 4, cpus=12, memory_mb=32768, submitted=5),
    frac(6, 40_000, 50, submitted=6),
    job(7, 24, gpus_per_node=8, submitted=7),
    job(8, 1, cpus=60, submitted=8),
]


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_books_a_mixed_queue_soundly(name: str) -> None:
    s = snap(NODES, QUEUE, teams=[team("t")])
    plan = _policy_or_skip(name).schedule(s)
    assert_plan_valid(s, plan)
    places = {p.job_id: p for p in plan.places}
    gangs = [p for p in plan.places if p.members]
    assert gangs, "no multi-node gang placed on a fleet with room for one"
    for place in gangs:
        assert len(place.allocations) == {1: 2, 4: 2, 7: 3}[place.job_id]
    if name in ("fcfs", "priority", "backfill"):
        # In submit order job 1 comes first; CPUs and memory rule out r2a, so r1 holds it.
        assert sorted(m.node for m in places[1].allocations) == ["r1a", "r1b"]
        assert 7 not in places


def test_checker_catches_broken_gangs_and_host_overbooking() -> None:
    s = snap(NODES, QUEUE, teams=[team("t")])

    def plan(*places: Place) -> Plan:
        listed = {p.job_id for p in places}
        rest = tuple(Wait(j.id, "waits") for j in s.pending if j.id not in listed)
        return Plan("x", places=places, waits=rest, order=tuple(j.id for j in s.pending))

    eight = tuple(range(8))
    cases = {
        "two members on one node": plan(Place(1, "r1a", eight, members=(Member("r1a", eight),))),
        "spans 2 nodes, placed on 1": plan(Place(1, "r1a", eight)),
        "needs 8 GPUs on r2b": plan(Place(1, "r1a", eight, members=(Member("r2b", (0, 1)),))),
        "CPUs over-committed": plan(Place(2, "r2a", (0, 1)), Place(8, "r2a", (2,))),
        "must share one group": plan(
            Place(4, "r1a", (0, 1, 2, 3), members=(Member("r2b", (0, 1, 2, 3)),))
        ),
    }
    for expected, broken in cases.items():
        problems = plan_violations(s, broken)
        assert any(expected in p for p in problems), (expected, problems)
    sound = plan(Place(1, "r1a", eight, members=(Member("r1b", eight),)))
    assert plan_violations(s, sound) == []
