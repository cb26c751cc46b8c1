"""Multi-node gangs, host CPUs/memory and topology groups in the simulator: cluster specs,
job shaping, booking and release of every member, spread slowdown, gang-wait accounting."""

import pytest

from scheduler.core.model import Member, Place, Plan
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.engine import apply_plan, simulate
from scheduler.sim.jobs import JobSpec
from scheduler.sim.metrics import compute_metrics
from scheduler.sim.oracle import SrptOracle
from scheduler.sim.state import SimConfig, SimState
from scheduler.sim.transform import PrepReport, gang_width, handle_oversize, prepare

from .conftest import job


def test_cluster_options_give_host_cpus_memory_and_groups():
    spec = parse_cluster("4x8xV100[cpus=64,mem=512,group=2]+3x4xT4", nodes_per_group=3)
    v100 = [n for n in spec.nodes if n.model == "V100"]
    t4 = [n for n in spec.nodes if n.model == "T4"]
    assert {(n.cpus, n.host_memory_mb) for n in v100} == {(64, 512 * 1024)}
    assert [n.group for n in v100] == ["g000", "g000", "g001", "g001"]
    assert [n.group for n in t4] == ["g002", "g002", "g002"]
    assert {(n.cpus, n.host_memory_mb) for n in t4} == {(None, None)}
    states = spec.node_states()
    assert (states[0].cpus, states[0].free_cpus, states[0].free_memory_mb) == (64, 64, 512 * 1024)
    assert states[0].group == "g000" and states[-1].free_cpus is None
    assert spec.groups == 3
    assert parse_cluster("16x4xT4").nodes[0].group == ""


@pytest.mark.parametrize(
    "bad", ["2x8xV100[cpus=0]", "2x8xV100[gpus=4]", "2x8xV100[cpus]", "2x8xV100[mem=lots]"]
)
def test_bad_cluster_options_are_refused_with_the_part_named(bad):
    with pytest.raises(ValueError, match="2x8xV100"):
        parse_cluster(bad)


def test_jobs_over_a_node_become_gangs_and_only_what_never_fits_is_dropped():
    cluster = parse_cluster("8x8xV100")
    raw = [job(1, 0, 100, 32), job(2, 1, 100, 12), job(3, 2, 100, 128), job(4, 3, 100, 2)]
    jobs, rep = prepare(raw, total_gpus=64, max_node_gpus=8, cluster=cluster)
    assert rep.ganged == 3 and rep.dropped_unfit == 1 and rep.kept == 3
    assert "needs 16 node(s)" in rep.notes[0] and "has 8" in rep.notes[0]
    shapes = [(j.gpus, j.gpus_per_node, j.nodes) for j in jobs]
    assert shapes == [(32, 8, 4), (12, 6, 2), (2, 0, 1)]
    assert gang_width(24, 8) == 8 and gang_width(12, 8) == 6 and gang_width(7, 4) == 1
    old = handle_oversize(raw, 8, "drop", PrepReport())
    assert [j.gpus for j in old] == [2]


def test_host_requests_default_in_proportion_to_each_members_gpus():
    cluster = parse_cluster("4x8xV100[cpus=16,mem=128]")
    raw = [job(1, 0, 100, 16), job(2, 0, 100, 1), job(3, 0, 100, 2, cpus=3), job(4, 0, 50, 8)]
    jobs, rep = prepare(
        raw,
        total_gpus=32,
        max_node_gpus=8,
        cluster=cluster,
        cpus_per_gpu=2,
        memory_gb_per_gpu=16,
    )
    by_gpus = {(j.gpus, j.duration): (j.cpus, j.memory_mb) for j in jobs}
    assert by_gpus[(16, 100)] == (16, 8 * 16 * 1024)  # per member: 8 GPUs
    assert by_gpus[(1, 100)] == (2, 16 * 1024)
    assert by_gpus[(2, 100)] == (3, 32 * 1024)  # asked CPUs are kept
    assert by_gpus[(8, 50)] == (16, 128 * 1024)
    tight, rep2 = prepare(
        raw, total_gpus=32, max_node_gpus=8, cluster=cluster, cpus_per_gpu=4, memory_gb_per_gpu=0
    )
    assert rep2.dropped_unfit == 2  # 8 GPUs x 4 CPUs on a 16-CPU node, twice
    assert "32 CPUs" in rep2.notes[0]


def _state(cluster_text, jobs, **config):
    state = SimState(jobs, parse_cluster(cluster_text), SimConfig(**config))
    state.advance(0.0)
    return state


def _booked(state):
    """Per node: GPUs, CPUs and memory held by running jobs, from their allocations."""
    gpus, cpus, mem = {}, {}, {}
    for r in state.running.values():
        for m in r.allocations:
            for i in m.gpu_indices:
                key = (m.node, i)
                assert key not in gpus, f"GPU {key} held by {gpus.get(key)} and {r.id}"
                gpus[key] = r.id
            cpus[m.node] = cpus.get(m.node, 0) + r.cpus
            mem[m.node] = mem.get(m.node, 0) + r.memory_mb
    return gpus, cpus, mem


def _check_books(state):
    """Free GPUs, CPUs and memory in the snapshot are the node's minus what jobs hold."""
    gpus, cpus, mem = _booked(state)
    for n in state.node_states():
        for g in n.gpus:
            assert g.is_whole_free == ((n.name, g.index) not in gpus)
        if n.cpus is not None:
            assert n.free_cpus == n.cpus - cpus.get(n.name, 0) >= 0
        if n.memory_mb is not None:
            assert n.free_memory_mb == n.memory_mb - mem.get(n.name, 0) >= 0
    assert state.idle_gpus == state.total_gpus - len(gpus)


def test_a_gang_place_books_every_member_and_release_frees_them_all():
    gang = job(1, 0, 1000, 8, gpus_per_node=4, cpus=10, memory_mb=1000)
    small = job(2, 0, 500, 1, cpus=2, memory_mb=100)
    state = _state("3x4xT4[cpus=12,mem=4]", [gang, small])
    plan = Plan(
        "hand",
        places=(
            Place(1, "t4-000", (0, 1, 2, 3), members=(Member("t4-002", (0, 1, 2, 3)),)),
            Place(2, "t4-000", (0,)),  # GPUs already taken by the gang: skipped
        ),
    )
    assert apply_plan(state, plan) == 1
    assert state.invalid_decisions == ["place 2: GPU t4-000/0 is not free"]
    running = state.running[1]
    assert running.allocations == (
        Member("t4-000", (0, 1, 2, 3)),
        Member("t4-002", (0, 1, 2, 3)),
    )
    assert (running.gpus_per_node, running.cpus, running.memory_mb) == (4, 10, 1000)
    _check_books(state)
    assert state.start(2, "t4-002", (0,)) == "GPU t4-002/0 is not free"
    assert state.start(2, "t4-001", (3,)) is None
    _check_books(state)
    assert state.preempt(1) is None
    assert state.running.keys() == {2}
    _check_books(state)
    assert state.idle_gpus == 11
    state.advance(500.0)  # job 2 ends
    _check_books(state)
    assert state.idle_gpus == 12 and all(
        n.free_cpus == 12 and n.free_memory_mb == 4096 for n in state.node_states()
    )


@pytest.mark.parametrize(
    "members, why",
    [
        ((), "runs on 2 node(s), got 1"),
        ((Member("t4-000", (0, 1, 2, 3)),), "one member per node"),
        ((Member("t4-001", (0, 1)),), "needs 4 GPUs on node t4-001"),
        ((Member("t4-001", (0, 1, 2, 3)), Member("t4-002", (0, 1, 2, 3))), "got 3"),
    ],
)
def test_a_bad_gang_place_is_skipped_and_books_nothing(members, why):
    state = _state("3x4xT4", [job(1, 0, 100, 8, gpus_per_node=4)])
    result = state.start(1, "t4-000", (0, 1, 2, 3), members)
    assert result is not None and why in result
    assert state.running == {} and 1 in state.pending
    assert state.idle_gpus == 12
    _check_books(state)


def test_host_cpus_and_memory_limit_where_a_job_starts():
    jobs = [job(1, 0, 100, 1, cpus=6), job(2, 0, 100, 1, cpus=6), job(3, 0, 100, 1, memory_mb=10)]
    state = _state("1x4xT4[cpus=8,mem=1]", jobs)
    assert state.start(1, "t4-000", (0,)) is None
    why = state.start(2, "t4-000", (1,))
    assert why and "2 CPUs" in why and "needs 6" in why
    assert state.start(3, "t4-000", (1,)) is None
    _check_books(state)


@pytest.mark.parametrize("rate, end", [(0.0, 1000.0), (0.5, 1500.0)])
def test_a_gang_over_two_groups_runs_slower_by_the_spread_slowdown(rate, end):
    gang = job(1, 0, 1000, 8, gpus_per_node=4)
    state = _state("4x4xT4[group=2]", [gang], gang_spread_slowdown=rate)
    assert state.start(1, "t4-000", (0, 1, 2, 3), (Member("t4-002", (0, 1, 2, 3)),)) is None
    state.advance(5000.0)
    run = state.jobs[1]
    assert run.finish == end
    assert run.spread_gpu_seconds == pytest.approx((end - 1000.0) * 8)
    assert run.busy_gpu_seconds == pytest.approx(end * 8)


def test_a_gang_within_one_group_and_as_few_nodes_as_needed_is_not_slowed():
    state = _state("4x4xT4[group=2]", [job(1, 0, 1000, 8, gpus_per_node=4)])
    assert state.start(1, "t4-002", (0, 1, 2, 3), (Member("t4-003", (0, 1, 2, 3)),)) is None
    assert state.jobs[1].slowdown == 1.0
    # Four-GPU members of a 16-GPU job on 8-GPU nodes: four nodes where two would do.
    wide = _state("4x8xV100", [job(1, 0, 1000, 16, gpus_per_node=4)], gang_spread_slowdown=0.25)
    members = tuple(Member(f"v100-00{i}", (0, 1, 2, 3)) for i in (1, 2, 3))
    assert wide.start(1, "v100-000", (0, 1, 2, 3), members) is None
    assert wide.jobs[1].slowdown == 1.5


def test_a_preempted_gang_keeps_progress_net_of_the_slowdown_with_checkpoints():
    gang = job(1, 0, 1000, 8, gpus_per_node=4)
    state = _state(
        "2x4xT4[group=1]",
        [gang],
        gang_spread_slowdown=1.0,
        checkpointing=True,
        restart_overhead=60,
    )
    assert state.start(1, "t4-000", (0, 1, 2, 3), (Member("t4-001", (0, 1, 2, 3)),)) is None
    state.advance(400.0)
    assert state.preempt(1) is None
    run = state.jobs[1]
    assert run.done_work == 200.0  # 400 s at half speed
    assert run.spread_gpu_seconds == pytest.approx(200.0 * 8)
    assert state.start(1, "t4-000", (0, 1, 2, 3), (Member("t4-001", (0, 1, 2, 3)),)) is None
    state.advance(10_000.0)
    assert run.finish == 400.0 + 60.0 + 800.0 * 2
    assert run.busy_gpu_seconds == pytest.approx(
        gang.work * 8 + run.lost_gpu_seconds + run.spread_gpu_seconds
    )


def test_gpus_left_idle_while_a_gang_is_the_oldest_waiting_job_are_counted():
    # A 1-GPU job holds node 0 from 0 to 100; a 2x4 gang arrives at 10 and cannot start
    # until 100: 7 GPUs idle for 90 s while it is the oldest waiting job.
    jobs = [job(1, 0, 100, 1), job(2, 10, 1000, 8, gpus_per_node=4)]
    result = simulate(jobs, parse_cluster("2x4xT4"), SrptOracle(), SimConfig())
    runs = result.state.jobs
    assert (runs[2].first_start, runs[2].finish) == (100, 1100)
    m = compute_metrics(result)
    assert m["gang_wait_gpu_seconds"] == pytest.approx(7 * 90)
    assert m["gang_wait_share"] == pytest.approx(7 * 90 / (8 * 1100))
    assert m["gangs"] == 1 and m["gang_jct_avg"] == 1090
    # Without gangs nothing is counted.
    single = simulate([job(1, 0, 100, 1), job(2, 10, 50, 4)], parse_cluster("2x4xT4"), SrptOracle())
    assert compute_metrics(single)["gang_wait_gpu_seconds"] == 0


def test_a_gang_that_can_never_fit_is_refused_with_a_reason():
    jobs = [job(1, 0, 100, 12, gpus_per_node=4), job(2, 0, 100, 8, gpus_per_node=4, cpus=9)]
    result = simulate(jobs, parse_cluster("2x4xT4[cpus=8]"), SrptOracle(), SimConfig())
    assert [r.state for r in result.state.jobs.values()] == ["rejected", "rejected"]
    assert "needs 3 node(s)" in result.state.rejected[0]
    assert "9 CPU" in result.state.rejected[1]


def test_gang_run_spec_has_members_of_equal_width():
    spec = JobSpec(id=1, submit=0, duration=10, gpus=16, team="a", user="a", gpus_per_node=8)
    assert (spec.nodes, spec.gpus_on_each_node) == (2, 8)
    assert JobSpec(id=2, submit=0, duration=1, gpus=4, team="a", user="a").nodes == 1
