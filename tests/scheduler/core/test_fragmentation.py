"""Fragmentation-aware placement: where best fit and the fragmentation-aware choice differ
and the latter is right, gangs and fractions, and the scorer's rises checked against the
node measure they are differences of."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.fragmentation import (
    DEFAULT_DEMAND,
    DemandShape,
    blend,
    demand_from_jobs,
    demand_of_snapshot,
    node_fragmentation,
    normalize,
    shape_of,
)
from scheduler.core.fragmentation.params import MAX_SAMPLE, PRIOR
from scheduler.core.model import GpuState, NodeState, Snapshot
from scheduler.core.placement import FreeCapacity
from scheduler.policies import get_policy, policy_names
from tests.scheduler.core.builders import frac, job, node, running, snap
from tests.scheduler.invariants import assert_plan_valid
from tests.scheduler.policies.strategies import snapshots

GB = 1024


def _place_all(cap: FreeCapacity, jobs) -> list:
    out = []
    for j in jobs:
        members = cap.best_fit_members(j)
        out.append(members)
        if members is not None:
            cap.take_members(j, members)
    return out


def test_single_gpu_keeps_an_even_block_for_the_two_gpu_demand():
    # a has 3 free GPUs, b has 2. Best fit puts one GPU on b and leaves room for a single
    # 2-GPU job; the aware choice takes a's odd GPU and leaves room for two.
    nodes = [node("a", 4), node("b", 4)]
    s = snap(nodes, running_jobs=[running(1, "a", (0,)), running(2, "b", (0, 1))])
    demand = ((DemandShape(2), 1.0),)
    plain, aware = FreeCapacity(s.nodes), FreeCapacity(s.nodes, demand)
    assert plain.best_fit(job(10, 1))[0] == "b"
    assert aware.best_fit(job(10, 1))[0] == "a"
    later = [job(11, 2), job(12, 2)]
    assert _place_all(plain, [job(10, 1), *later])[2] is None
    assert None not in _place_all(aware, [job(10, 1), *later])


def test_whole_gpu_goes_to_the_kind_the_demand_needs_least():
    # One free V100 (32 GB) and one free A100 (80 GB); the demand is mostly 40 GB fractions
    # that only an A100 holds. Best fit takes the first kind it meets (the A100).
    a100 = NodeState("big", (GpuState(0, "A100", 80 * GB, 80 * GB),))
    v100 = NodeState("small", (GpuState(0, "V100", 32 * GB, 32 * GB),))
    demand = ((DemandShape(0, 50, 40 * GB), 0.8), (DemandShape(1), 0.2))
    plain, aware = FreeCapacity((a100, v100)), FreeCapacity((a100, v100), demand)
    jobs = [job(1, 1), frac(2, 40 * GB, 50)]
    assert _place_all(plain, jobs)[1] is None
    placed = _place_all(aware, jobs)
    assert placed[0][0].node == "small" and placed[1][0].node == "big"


def test_a_kind_that_some_requests_name_is_kept_for_them():
    # Two T4s and two A100s free; a tenth of the demand names the T4. Best fit fills the
    # T4s first (the first kind it meets) and the T4 jobs find none.
    t4 = NodeState("t4", tuple(GpuState(i, "T4", 16 * GB, 16 * GB) for i in range(2)))
    a100 = NodeState("a100", tuple(GpuState(i, "A100", 80 * GB, 80 * GB) for i in range(2)))
    demand = ((DemandShape(1), 0.9), (DemandShape(1, gpu_model="T4"), 0.1))
    plain, aware = FreeCapacity((t4, a100)), FreeCapacity((t4, a100), demand)
    jobs = [job(1, 1), job(2, 1), job(3, 1, gpu_model="T4"), job(4, 1, gpu_model="T4")]
    assert _place_all(plain, jobs)[2:] == [None, None]
    placed = _place_all(aware, jobs)
    assert [p[0].node for p in placed] == ["a100", "a100", "t4", "t4"]


def test_fraction_goes_where_it_leaves_memory_the_demand_can_use():
    # GPU 0 has 50 % and 60 GB free, GPU 1 60 % and 20 GB. Best fit (least compute left)
    # takes GPU 0 and leaves no GPU with 40 % and 40 GB; the aware choice takes GPU 1.
    gpus = (
        GpuState(0, "A100", 80 * GB, 60 * GB, 50),
        GpuState(1, "A100", 80 * GB, 20 * GB, 60),
    )
    nodes = (NodeState("n", gpus),)
    demand = ((DemandShape(0, 40, 40 * GB), 1.0),)
    small, big = frac(1, 10 * GB, 40), frac(2, 40 * GB, 40)
    plain, aware = FreeCapacity(nodes), FreeCapacity(nodes, demand)
    assert plain.best_fit(small) == ("n", (0,))
    assert aware.best_fit(small) == ("n", (1,))
    assert _place_all(plain, [small, big])[1] is None
    assert _place_all(aware, [small, big])[1] is not None


def test_fraction_prefers_a_partly_used_gpu_over_breaking_a_whole_one():
    gpus = (GpuState(0, "A100", 80 * GB, 40 * GB, 50), GpuState(1, "A100", 80 * GB, 80 * GB))
    cap = FreeCapacity((NodeState("n", gpus),), ((DemandShape(1), 0.5), (DemandShape(0, 25), 0.5)))
    assert cap.best_fit(frac(1, 10 * GB, 25)) == ("n", (0,))


def test_gang_members_keep_four_gpu_blocks_whole():
    # Two nodes with 5 free GPUs, two with 4. Best fit puts the 2 x 1 gang on the 4s and
    # leaves two 4-GPU blocks; the aware choice uses the 5s and leaves four.
    nodes = [node(n, 8, group="r1") for n in ("a", "b", "c", "d")]
    s = snap(
        nodes,
        running_jobs=[
            running(1, "a", (0, 1, 2)),
            running(2, "b", (0, 1, 2)),
            running(3, "c", (0, 1, 2, 3)),
            running(4, "d", (0, 1, 2, 3)),
        ],
    )
    gang = job(10, 2, gpus_per_node=1)
    demand = ((DemandShape(4), 1.0),)
    plain, aware = FreeCapacity(s.nodes), FreeCapacity(s.nodes, demand)
    assert {m.node for m in plain.best_fit_members(gang)} == {"c", "d"}
    members = aware.best_fit_members(gang)
    assert {m.node for m in members} == {"a", "b"}
    assert aware.fits_members(gang, members)
    fours = [job(20 + i, 4) for i in range(4)]
    assert None not in _place_all(aware, [gang, *fours])
    assert _place_all(plain, [gang, *fours]).count(None) == 2


def test_host_memory_counts_where_nodes_report_it():
    # Both nodes have 2 free GPUs; node a has just enough host memory for one 1-GPU job
    # of the demand, node b plenty. Taking a's memory would strand its other GPU.
    a = replace(node("a", 2), memory_mb=100 * GB, free_memory_mb=64 * GB)
    b = replace(node("b", 2), memory_mb=512 * GB, free_memory_mb=400 * GB)
    demand = ((DemandShape(1, host_memory_mb=32 * GB), 1.0),)
    aware = FreeCapacity((a, b), demand)
    assert aware.best_fit(job(1, 1, memory_mb=48 * GB))[0] == "b"


def test_demand_comes_from_the_queue_with_a_prior_and_can_be_switched_off():
    s = snap([node("a", 2)], pending=[frac(1, 10 * GB, 50), job(2, 2)])
    demand = dict(demand_of_snapshot(s))
    assert demand[DemandShape(2)] > 0 and demand[DemandShape(0, 50, 10 * GB)] > 0
    assert demand[DemandShape(1)] > 0  # the prior
    assert abs(sum(demand.values()) - 1) < 1e-9
    assert FreeCapacity.from_snapshot(s).fragmentation_aware
    off = replace(s, settings=MappingProxyType({"placement": "best_fit"}))
    assert not FreeCapacity.from_snapshot(off).fragmentation_aware
    assert demand_from_jobs([]) == DEFAULT_DEMAND


def _mix_by_hand(jobs) -> dict:
    """The sampled shape mix, counted in plain Python from `shape_of` of each job."""
    step = max(1, len(jobs) // MAX_SAMPLE)
    counts: dict = {}
    for j in jobs[::step]:
        counts[shape_of(j)] = counts.get(shape_of(j), 0) + 1
    total = sum(counts.values())
    return {sh: c / total for sh, c in counts.items()}


@pytest.mark.parametrize("queued,busy", [(0, 3), (5, 0), (300, 250), (700, 9), (1030, 517)])
def test_demand_samples_queue_and_running_jobs_as_one_list(queued, busy):
    # Shapes vary along both lists, so a sample shifted by one job would count others.
    pending = tuple(
        job(i, 1 + i % 3) if i % 5 else frac(i, GB * (1 + i % 4), 25) for i in range(queued)
    )
    on = tuple(running(10_000 + i, "a", tuple(range(1 + i % 7 // 2))) for i in range(busy))
    s = Snapshot(now=0.0, nodes=(node("a", 8),), pending=pending, running=on)
    whole = (*pending, *on)
    # Some of the jobs seen before (their shapes remembered), the others not.
    demand_from_jobs(whole[::3])
    got = dict(demand_of_snapshot(s))
    assert dict(demand_from_jobs(whole)) == pytest.approx(_mix_by_hand(whole))
    want = {sh: w * (1 - PRIOR) for sh, w in demand_from_jobs(whole)}
    want[DemandShape(1)] = want.get(DemandShape(1), 0.0) + PRIOR
    assert got == pytest.approx(want)


def test_a_decayed_history_keeps_what_it_was_told_to_keep():
    old = ((DemandShape(8), 1.0),)
    new = ((DemandShape(0, 25, 4 * GB), 1.0),)
    mixed = dict(blend(old, new, 0.25))
    assert abs(mixed[DemandShape(8)] - 0.25) < 1e-9
    assert abs(mixed[DemandShape(0, 25, 4 * GB)] - 0.75) < 1e-9


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    free=st.lists(
        st.tuples(st.sampled_from([0, 30, 50, 100]), st.sampled_from([0, 8, 40])),
        min_size=1,
        max_size=6,
    ),
    shapes=st.lists(
        st.one_of(
            st.builds(DemandShape, st.sampled_from([1, 2, 4])),
            st.builds(
                DemandShape,
                st.just(0),
                st.sampled_from([10, 20, 30, 50]),
                st.sampled_from([0, 8 * GB, 24 * GB]),
            ),
        ),
        min_size=1,
        max_size=4,
    ),
    request=st.one_of(
        st.sampled_from([1, 2]).map(lambda g: job(1, g)),
        st.tuples(st.sampled_from([10, 20, 40]), st.sampled_from([4, 16, 30])).map(
            lambda t: frac(1, t[1] * GB, t[0])
        ),
    ),
)
def test_choice_on_one_node_is_the_least_rise_of_the_exact_measure(free, shapes, request):
    # At most two partly used compute buckets and two free-memory amounts per bucket, so
    # the scan limits (BUCKET_SCAN, MEMORY_SCAN) see every candidate.
    gpus = []
    for i, (comp, mem) in enumerate(free):
        whole = comp == 100
        gpus.append(
            GpuState(i, "A100", 80 * GB, 80 * GB if whole else mem * GB, 100 if whole else comp)
        )
    nodes = (NodeState("n", tuple(gpus)),)
    demand = tuple((s, 1.0 / len(shapes)) for s in shapes)
    aware = FreeCapacity(nodes, demand)
    plain = FreeCapacity(nodes)
    choice = aware.best_fit(request)
    assert (choice is None) == (plain.best_fit(request) is None)
    if choice is None:
        return
    assert aware.fits(request, *choice)

    def rise(spot) -> float:
        cap = FreeCapacity(nodes, demand)
        before = node_fragmentation(cap.scorer().demand, cap._by_name["n"])
        cap.take(request, *spot)
        return node_fragmentation(cap.scorer().demand, cap._by_name["n"]) - before

    best = min(rise(c) for c in aware.candidates(request))
    assert abs(rise(choice) - best) < 1e-6


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=snapshots(), data=st.data())
def test_every_policy_keeps_plans_valid_with_fragmentation_aware_placement(snapshot, data):
    name = data.draw(st.sampled_from([n for n in policy_names() if n not in ("ilp",)]))
    settings_ = dict(snapshot.settings, placement="fragmentation")
    s = replace(snapshot, settings=MappingProxyType(settings_))
    try:
        policy = get_policy(name, seed=1)
    except TypeError:
        policy = get_policy(name)
    assert_plan_valid(s, policy.schedule(s))


def test_normalize_answers_a_tuple_as_it_answers_the_same_pairs_in_a_list():
    pairs = ((DemandShape(2), 3.0), (DemandShape(1), 1.0), (DemandShape(2), 1.0))
    first = normalize(pairs)
    assert normalize(pairs) is first  # the same tuple again: remembered
    assert first == normalize(list(pairs))
    other = ((DemandShape(4), 1.0),)
    assert normalize(other) == normalize(list(other)) == ((DemandShape(4), 1.0),)
    assert normalize(pairs) == first
