"""GPUs that stopping attempts still hold (`Snapshot.holds`) come back when the holds
expire: the reservation search and the forecast count on them then, not never."""

from __future__ import annotations

from dataclasses import replace

from scheduler.core.eta import estimate
from scheduler.core.model import Occupant, Snapshot
from scheduler.policies import get_policy
from tests.scheduler.core.builders import frac, job, node, running, snap, taken_by, team


def _with_holds(s: Snapshot, *holds: Occupant) -> Snapshot:
    """The snapshot with these holds, their share taken off their GPUs (as production's
    nodes count them)."""
    return replace(s, nodes=taken_by(s.nodes, holds), holds=tuple(holds))


def _fleet(*pending, holds: tuple[Occupant, ...]) -> Snapshot:
    # Node a: both GPUs held by a stopping attempt. Node b: a job until 5000.
    s = snap(
        [node("a", 2), node("b", 2)],
        pending,
        [running(8, "b", (0, 1), started=0, limit=5000)],
        now=1000.0,
    )
    return _with_holds(s, *holds)


def test_the_forecast_gives_held_gpus_back_when_the_hold_expires() -> None:
    s = _fleet(job(1, 2, submitted=0, limit=600), holds=(Occupant(1075.0, "a", (0, 1), 2),))
    out = estimate(s, get_policy("fcfs"))
    assert out[1][1] == 1075.0
    # Without the hold's end the GPUs never came back: the job waited for node b.
    assert estimate(replace(s, holds=()), get_policy("fcfs"))[1][1] == 5000.0


def test_a_fraction_of_a_gpu_held_comes_back_as_that_fraction() -> None:
    s = snap([node("a", 1)], [frac(1, 40000, 60)], now=1000.0)
    s = _with_holds(s, Occupant(1050.0, "a", (0,), 0, 50000, 70))
    # 30 % of compute is free now, the job asks 60 %: it starts when the hold ends.
    assert estimate(s, get_policy("fcfs"))[1][1] == 1050.0


def test_an_expired_hold_is_given_back_at_once() -> None:
    s = _fleet(job(1, 2, limit=600), holds=(Occupant(900.0, "a", (0, 1), 2),))
    assert estimate(s, get_policy("fcfs"))[1][1] == 1000.0


def test_a_hold_counts_against_no_quota_when_it_ends() -> None:
    s = _fleet(
        job(1, 2, team="lab", limit=600),
        holds=(Occupant(1075.0, "a", (0, 1), 2),),
    )
    s = replace(s, teams={"lab": team("lab", hard_limit_gpus=2)})
    # The hold's end gives the quota ledger nothing back it did not take.
    assert estimate(s, get_policy("fcfs"))[1][1] == 1075.0


def test_the_reservation_counts_on_held_gpus_at_their_expiry() -> None:
    # A 2-GPU job cannot start: the reservation is on a when the hold ends, not on b.
    held = (Occupant(1075.0, "a", (0, 1), 2),)
    for fast in (True, False):
        s = _fleet(job(1, 2, limit=600), holds=held)
        s = replace(s, settings={"fast_paths": fast})
        plan = get_policy("backfill").schedule(s)
        assert [(r.job_id, r.node, r.start) for r in plan.reserves] == [(1, "a", 1075.0)]
        # A later short job that ends before 1075 could not use a: nothing runs on it.
        blind = get_policy("backfill").schedule(replace(s, holds=()))
        assert [(r.node, r.start) for r in blind.reserves] == [("b", 5000.0)]


def test_a_gang_reservation_counts_on_held_gpus() -> None:
    s = snap(
        [node("a", 2), node("b", 2), node("c", 2)],
        [job(1, 4, gpus_per_node=2, limit=600)],
        [running(8, "c", (0, 1), started=0, limit=5000)],
        now=1000.0,
    )
    s = _with_holds(s, Occupant(1200.0, "a", (0, 1), 2), Occupant(1100.0, "b", (0, 1), 2))
    plan = get_policy("backfill").schedule(s)
    assert [(r.job_id, r.start) for r in plan.reserves] == [(1, 1200.0)]
    assert {plan.reserves[0].node, *(m.node for m in plan.reserves[0].members)} == {"a", "b"}
