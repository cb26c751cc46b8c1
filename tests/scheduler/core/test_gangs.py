"""Multi-node gangs and host CPUs/memory in the scheduler core: placement, booking,
reservations, preemption, admission, explanations, ETAs and quotas."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from scheduler.core.admission import admission_error
from scheduler.core.eta import estimate
from scheduler.core.explain import resource_reason
from scheduler.core.model import Member, NodeState, RunningJob, Snapshot
from scheduler.core.placement import FreeCapacity
from scheduler.core.preemption import choose_victims
from scheduler.core.quota import QuotaLedger
from scheduler.core.reservation import earliest_start, earliest_start_members, running_occupants
from scheduler.policies import get_policy
from tests.scheduler.core.builders import frac, job, node, running, team


def hosted(name: str, gpus: int = 8, *, cpus: int | None = 32, memory_mb: int | None = None,
           group: str = "", **kw: Any) -> NodeState:  # fmt: skip
    return replace(node(name, gpus, **kw), cpus=cpus, memory_mb=memory_mb, group=group)


def gang_snap(nodes, pending=(), running_jobs=(), *, teams=(), settings=None, now=1000.0):
    """A consistent snapshot where running jobs may span nodes and hold host CPUs/memory."""
    by_name = {n.name: n for n in nodes}
    for r in running_jobs:
        for m in r.allocations:
            n = by_name[m.node]
            gpus = tuple(
                replace(g, free_memory_mb=0, free_compute_percent=0)
                if g.index in m.gpu_indices
                else g
                for g in n.gpus
            )
            by_name[m.node] = replace(n, gpus=gpus)
    out = []
    for n in nodes:
        n = by_name[n.name]
        used = [r for r in running_jobs for m in r.allocations if m.node == n.name]
        cpus = None if n.cpus is None else n.cpus - sum(r.cpus for r in used)
        mem = None if n.memory_mb is None else n.memory_mb - sum(r.memory_mb for r in used)
        out.append(replace(n, free_cpus=cpus, free_memory_mb=mem))
    return Snapshot(
        now=now,
        nodes=tuple(out),
        running=tuple(running_jobs),
        pending=tuple(pending),
        teams=MappingProxyType({t.slug: t for t in teams}),
        settings=MappingProxyType(dict(settings or {})),
    )


def gang(job_id: int, gpus: int, per: int, **kw: Any):
    return job(job_id, gpus, gpus_per_node=per, **kw)


def run_gang(job_id: int, members: list[tuple[str, tuple[int, ...]]], **kw: Any) -> RunningJob:
    first, *rest = members
    per = len(first[1])
    return running(
        job_id,
        first[0],
        first[1],
        gpus=per * len(members),
        gpus_per_node=per,
        members=tuple(Member(n, i) for n, i in rest),
        **kw,
    )


# -- host CPUs and memory ------------------------------------------------------------------


def test_job_goes_only_where_its_cpus_fit_and_booking_takes_them():
    s = gang_snap([hosted("a", 4, cpus=4), hosted("b", 8, cpus=16)])
    cap = FreeCapacity.from_snapshot(s)
    want = job(1, 2, cpus=8)
    # a has the tighter GPU fit but only 4 CPUs.
    assert cap.best_fit(want)[0] == "b"
    cap.take(want, *cap.best_fit(want))
    assert cap.host_free("b") == (8, None)
    second = job(2, 2, cpus=8)
    cap.take(second, *cap.best_fit(second))
    assert cap.host_free("b") == (0, None)
    # GPUs are still free on a and b, but neither has 8 CPUs left.
    assert cap.best_fit(job(3, 1, cpus=8)) is None
    cap.release(want, "b", (0, 1))
    assert cap.host_free("b") == (8, None)
    assert cap.best_fit(job(3, 1, cpus=8)) is not None


def test_node_not_reporting_host_is_not_limited_and_jobs_without_host_needs_ignore_it():
    s = gang_snap([hosted("a", 2, cpus=None), hosted("b", 2, cpus=1)])
    cap = FreeCapacity.from_snapshot(s)
    assert cap.best_fit(job(1, 2, cpus=500))[0] == "a"
    # No host need: the usual tightest fit, whatever the CPUs.
    assert cap.best_fit(job(2, 2)) is not None


def test_memory_fits_like_cpus_and_fractions_respect_it():
    s = gang_snap(
        [hosted("a", 1, cpus=None, memory_mb=4096), hosted("b", 1, cpus=None, memory_mb=65536)]
    )
    cap = FreeCapacity.from_snapshot(s)
    small = frac(1, 1000, 20, memory_mb=8192)
    assert cap.best_fit(small)[0] == "b"
    assert not cap.fits(small, "a", (0,))
    assert cap.fits(small, "b", (0,))


def test_policy_never_overbooks_cpus_on_a_node():
    s = gang_snap([hosted("a", 8, cpus=16)], [job(i, 1, cpus=6) for i in range(1, 5)])
    plan = get_policy("fcfs").schedule(s)
    assert len(plan.places) == 2
    waiting = {w.job_id: w.reason for w in plan.waits}
    assert waiting[3].startswith("6 GPUs are free on a but it has 4 of the 6 CPUs this job needs")


def test_memory_shortfall_sentence():
    s = gang_snap([hosted("a", 4, cpus=None, memory_mb=16384)])
    cap = FreeCapacity.from_snapshot(s)
    reason = resource_reason(job(1, 2, memory_mb=65536), cap)
    assert (
        reason == "4 GPUs are free on a but it has 16 GB of the 64 GB of host memory this job needs"
    )


# -- gang placement ----------------------------------------------------------------------


def test_gang_takes_distinct_nodes_all_or_nothing():
    s = gang_snap([hosted("a", 8), hosted("b", 8), hosted("c", 4)])
    cap = FreeCapacity.from_snapshot(s)
    want = gang(1, 16, 8)
    members = cap.best_fit_members(want)
    assert sorted(m.node for m in members) == ["a", "b"]
    assert all(len(m.gpu_indices) == 8 for m in members)
    assert cap.fits_members(want, members)
    cap.take_members(want, members)
    # Only c is left: a second 2-node gang does not fit and books nothing.
    assert cap.best_fit_members(gang(2, 8, 4)) is None
    assert cap.whole_free("c") == (0, 1, 2, 3)
    cap.release_members(want, members)
    assert cap.free_gpus_total() == 20


def test_gang_members_share_one_gpu_kind():
    s = gang_snap([node("a", 4), node("b", 4, model="V100", memory_mb=32768), node("c", 2)])
    cap = FreeCapacity.from_snapshot(s)
    assert cap.best_fit_members(gang(1, 8, 4)) is None
    members = cap.best_fit_members(gang(2, 4, 2))
    assert {m.node for m in members} in ({"a", "c"}, {"b", "a"}, {"b", "c"})
    kinds = {g.model for m in members for n in s.nodes if n.name == m.node for g in n.gpus}
    assert len(kinds) == 1
    assert not cap.fits_members(gang(3, 4, 2), (Member("a", (0, 1)), Member("b", (0, 1))))


def test_gang_prefers_one_group_then_tight_nodes():
    nodes = [
        hosted("a1", 8, group="r1"),
        hosted("b1", 4, group="r2"),
        hosted("b2", 8, group="r2"),
        hosted("c1", 8, group="r3"),
    ]
    cap = FreeCapacity.from_snapshot(gang_snap(nodes))
    members = cap.best_fit_members(gang(1, 8, 4))
    # Only r2 holds both members; b1 is the tighter node, so it is rank 0.
    assert [m.node for m in members] == ["b1", "b2"]
    spread = cap.best_fit_members(gang(2, 12, 4))
    assert len({cap.group_of(m.node) for m in spread}) == 2


def test_same_group_is_a_requirement():
    nodes = [hosted("a", 4, group="r1"), hosted("b", 4, group="r2"), hosted("c", 4)]
    cap = FreeCapacity.from_snapshot(gang_snap(nodes))
    assert cap.best_fit_members(gang(1, 8, 4, same_group=True)) is None
    assert cap.best_fit_members(gang(2, 8, 4)) is not None
    s = gang_snap(nodes, [gang(3, 8, 4, same_group=True)])
    assert admission_error(s.pending[0], s.nodes, None) == (
        "must keep its 2 nodes in one topology group; the largest group has 1 nodes with "
        "4 GPUs each"
    )


def test_gang_member_needs_host_share_on_every_node():
    nodes = [hosted("a", 4, cpus=64), hosted("b", 4, cpus=8), hosted("c", 4, cpus=64)]
    cap = FreeCapacity.from_snapshot(gang_snap(nodes))
    want = gang(1, 8, 4, cpus=32)
    members = cap.best_fit_members(want)
    assert sorted(m.node for m in members) == ["a", "c"]
    cap.take_members(want, members)
    assert cap.host_free("a") == (32, None) and cap.host_free("c") == (32, None)


@pytest.mark.parametrize("name", ["fcfs", "priority", "backfill", "greedy", "genetic", "ilp"])
def test_policies_place_gang_whole_with_members(name: str):
    s = gang_snap([hosted("a", 4), hosted("b", 4), hosted("c", 2)], [gang(1, 8, 4), job(2, 2)])
    plan = get_policy(name).schedule(s)
    by_id = {p.job_id: p for p in plan.places}
    assert set(by_id) == {1, 2}
    assert sorted(m.node for m in by_id[1].allocations) == ["a", "b"]
    assert by_id[2].node == "c"
    if name == "ilp":
        assert any("outside the solver's model" in n for n in plan.notes)


# -- reservations ------------------------------------------------------------------------


def test_gang_reservation_spans_nodes_at_earliest_time():
    run = [
        running(1, "a", (0, 1, 2, 3), limit=500, started=1000),
        running(2, "b", (0, 1, 2, 3), limit=2000, started=1000),
        running(3, "c", (0, 1, 2, 3), limit=900, started=1000),
    ]
    s = gang_snap([hosted("a", 4), hosted("b", 4), hosted("c", 4)], running_jobs=run)
    cap = FreeCapacity.from_snapshot(s)
    occupants = running_occupants(s.running, use_predictions=False)
    start, members = earliest_start_members(gang(9, 8, 4), cap, occupants, s.now)
    assert start == 1900 and sorted(m.node for m in members) == ["a", "c"]
    # One-node view of the same sweep for a job asking for CPUs.
    assert earliest_start(job(8, 4, cpus=4), cap, occupants, s.now)[:2] == ("a", 1500)


def test_gang_reservation_waits_for_host_memory_to_come_back():
    run = [running(1, "a", (0,), limit=3000, started=1000, memory_mb=60000)]
    s = gang_snap([hosted("a", 4, cpus=None, memory_mb=65536), hosted("b", 4, cpus=None,
                                                                      memory_mb=65536)],
                  running_jobs=run)  # fmt: skip
    cap = FreeCapacity.from_snapshot(s)
    occupants = running_occupants(s.running, use_predictions=False)
    start, members = earliest_start_members(gang(9, 6, 3, memory_mb=32768), cap, occupants, s.now)
    assert start == 4000 and {m.node for m in members} == {"a", "b"}


def test_backfill_cannot_starve_a_big_gang():
    run = [
        running(1, "a", (0, 1, 2, 3), limit=1000, started=1000),
        running(2, "b", (0, 1), limit=500, started=1000),
    ]
    pending = [
        gang(10, 8, 4, submitted=0),
        job(11, 2, limit=50_000, submitted=1),  # goes beside the reservation, on c
        job(12, 2, limit=50_000, submitted=2),  # would block b's free GPUs: must wait
        job(13, 2, limit=500, submitted=3),  # ends before the reservation: may use b
    ]
    s = gang_snap([hosted("a", 4), hosted("b", 4), hosted("c", 2)], pending, run)
    plan = get_policy("backfill").schedule(s)
    (reserve,) = plan.reserves
    assert reserve.job_id == 10 and reserve.start == 2000
    assert sorted([reserve.node, *(m.node for m in reserve.members)]) == ["a", "b"]
    places = {p.job_id: p for p in plan.places}
    assert places[11].node == "c" and "beside" in places[11].reason
    assert 12 not in places
    assert places[13].node == "b" and "ends before" in places[13].reason
    waits = {w.job_id: w for w in plan.waits}
    assert waits[10].eta == 2000 and "on a" in waits[10].reason and "on b" in waits[10].reason


def test_long_jobs_cannot_take_a_reserved_gangs_cpus():
    run = [running(1, "a", (0, 1, 2, 3), limit=1000, started=1000, cpus=4)]
    pending = [
        gang(10, 8, 4, cpus=16, submitted=0),
        job(11, 0, limit=50_000, submitted=1, gpu_memory_mb=100, gpu_compute_percent=10, cpus=16),
    ]
    s = gang_snap([hosted("a", 4, cpus=32), hosted("b", 5, cpus=24)], pending, run)
    plan = get_policy("backfill").schedule(s)
    assert [r.job_id for r in plan.reserves] == [10]
    # b's spare GPU is free, but the gang's 16 CPUs there are held for it.
    assert plan.places == ()


# -- preemption ----------------------------------------------------------------------------


def test_gang_preempts_to_free_whole_nodes():
    teams = [team("lab", guaranteed_gpus=8), team("big")]
    run = [
        running(1, "a", (0, 1, 2, 3), team="big", started=900),
        running(2, "b", (0, 1), team="big", started=950),
        running(3, "b", (2, 3), team="big", started=100),
        running(4, "c", (0, 1, 2, 3), team="big", started=0),
    ]
    s = gang_snap([hosted("a", 4), hosted("b", 4), hosted("c", 4)],
                  [gang(10, 8, 4, team="lab")], run, teams=teams)  # fmt: skip
    cap = FreeCapacity.from_snapshot(s)
    victims = choose_victims(s.pending[0], cap, run, s.now)
    # a costs 4 x 100, b costs 2 x 50 + 2 x 900, c costs 4 x 1000.
    assert {v.id for v in victims.jobs} == {1, 2, 3}
    assert sorted(m.node for m in victims.allocations) == ["a", "b"]
    plan = get_policy("priority").schedule(s)
    assert {p.job_id for p in plan.preempts} == {1, 2, 3}
    (wait,) = plan.waits
    assert "release GPUs on" in wait.reason and "a" in wait.reason and "b" in wait.reason


def test_preempting_a_multi_node_job_frees_all_its_members():
    teams = [team("lab", guaranteed_gpus=8), team("big")]
    victim = run_gang(1, [("a", (0, 1, 2, 3)), ("b", (0, 1, 2, 3))], team="big", started=500)
    other = running(2, "c", (0, 1, 2, 3), team="big", started=0)
    s = gang_snap([hosted("a", 4), hosted("b", 4), hosted("c", 4)],
                  [gang(10, 8, 4, team="lab")], [victim, other], teams=teams)  # fmt: skip
    victims = choose_victims(s.pending[0], FreeCapacity.from_snapshot(s), [victim, other], s.now)
    assert [v.id for v in victims.jobs] == [1]
    assert sorted(m.node for m in victims.allocations) == ["a", "b"]
    # A one-node job can also free its GPUs on the gang's second node.
    single = choose_victims(job(11, 4, team="lab"), FreeCapacity.from_snapshot(s),
                            [victim], s.now)  # fmt: skip
    assert single is not None and single.jobs == (victim,)


def test_preemption_also_needs_host_room():
    teams = [team("lab", guaranteed_gpus=8), team("big")]
    run = [
        running(1, "a", (0, 1), team="big", started=900, cpus=2),
        running(2, "a", (2, 3), team="big", started=500, cpus=30),
    ]
    s = gang_snap([hosted("a", 4, cpus=32)], [job(10, 2, team="lab", cpus=16)], run, teams=teams)
    victims = choose_victims(s.pending[0], FreeCapacity.from_snapshot(s), run, s.now)
    # Job 1 loses less work, but only job 2's end gives back 16 CPUs.
    assert [v.id for v in victims.jobs] == [2]


# -- admission and explanations --------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_kw", "sentence"),
    [
        (
            {"gpus": 12, "gpus_per_node": 8},
            "asks for 12 GPUs in members of 8 GPUs per node; the total must be a multiple of 8 "
            "(for example 8 or 16)",
        ),
        ({"gpus": 16, "gpus_per_node": 16}, "needs 16 GPUs on one node; the largest node has 8"),
        (
            {"gpus": 32, "gpus_per_node": 8, "gpu_model": "A100"},
            "needs 4 nodes with 8 A100 GPUs each; the fleet has 2",
        ),
        (
            {"gpus": 8, "gpus_per_node": 4, "memory_mb": 65536},
            "needs 64 GB of host memory per node; the largest node has 48 GB",
        ),
        ({"gpus": 1, "cpus": 96}, "needs 96 CPU cores per node; the largest node has 64"),
        (
            {"gpus": 0, "gpus_per_node": 2, "gpu_memory_mb": 100, "gpu_compute_percent": 5},
            "a fractional job runs on one GPU; leave gpus_per_node at 0",
        ),
    ],
)
def test_admission_refuses_never_fitting_requests(request_kw, sentence):
    nodes = (
        hosted("a", 8, cpus=64, memory_mb=49152),
        hosted("b", 8, cpus=32, memory_mb=32768),
        hosted("c", 4, cpus=16, memory_mb=16384),
    )
    gpus = request_kw.pop("gpus")
    assert admission_error(job(1, gpus, **request_kw), nodes, None) == sentence


def test_admission_counts_only_nodes_that_hold_a_whole_member():
    nodes = (hosted("a", 8, cpus=64), hosted("b", 8, cpus=8), hosted("c", 8, cpus=64))
    assert admission_error(gang(1, 16, 8, cpus=32), nodes, None) is None
    assert admission_error(gang(1, 24, 8, cpus=32), nodes, None) == (
        "needs 3 nodes with 8 GPUs each and the host CPUs and memory it asks for; the fleet has 2"
    )


def test_gang_wait_sentence_counts_nodes():
    run = [running(1, "b", (0, 1), limit=5000)]
    s = gang_snap([hosted("a", 4), hosted("b", 4), hosted("c", 4, cpus=2)], running_jobs=run)
    cap = FreeCapacity.from_snapshot(s)
    assert resource_reason(gang(9, 12, 4), cap) == (
        "needs 3 nodes with 4 GPUs each; 2 nodes have that many free now"
    )
    assert resource_reason(gang(9, 8, 4, cpus=8), cap) == (
        "needs 2 nodes with 4 GPUs each; 2 nodes have the GPUs free but only 1 also have the "
        "host CPUs and memory it asks for"
    )


# -- quota and ETA -------------------------------------------------------------------------


def test_quota_counts_a_gangs_total_gpus():
    victim = run_gang(1, [("a", (0, 1, 2, 3)), ("b", (0, 1, 2, 3))], team="lab")
    ledger = QuotaLedger({"lab": team("lab", hard_limit_gpus=10)}, [victim])
    assert ledger.usage("lab") == 8
    assert ledger.check(gang(2, 4, 2, team="lab")) is not None
    assert ledger.check(job(3, 2, team="lab")) is None


def test_eta_frees_every_member_of_a_running_gang():
    victim = run_gang(1, [("a", (0, 1, 2, 3)), ("b", (0, 1, 2, 3))], limit=1000, started=1000)
    s = gang_snap([hosted("a", 4), hosted("b", 4)], [gang(2, 8, 4)], [victim])
    eta = estimate(s, get_policy("fcfs"))
    assert eta[2][1] == 2000
