"""Whole runs: every job ends exactly once, GPU-seconds add up, bounds hold, and the
simulator asks production policies exactly what the production cycle would."""

import numpy as np
import pytest

from scheduler.core.model import Member, Place, Plan, Preempt
from scheduler.policies import get_policy
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.engine import PolicyDriver, apply_plan, simulate
from scheduler.sim.jobs import JobSpec
from scheduler.sim.metrics import compute_metrics
from scheduler.sim.oracle import SrptOracle
from scheduler.sim.sources import synthetic
from scheduler.sim.state import SimConfig
from scheduler.sim.transform import equal_guarantees, prepare

CLUSTER = parse_cluster("2x4xV100")


@pytest.fixture(scope="module")
def jobs():
    raw = synthetic(150, total_gpus=CLUSTER.total_gpus, load=0.9, n_teams=3, seed=7, max_gpus=4)
    prepared, _ = prepare(raw, total_gpus=8, max_node_gpus=4, seed=7)
    return prepared


def _config(jobs, **kw):
    # Guarantees make FCFS reclaim GPUs from borrowing teams, so runs include preemptions.
    return SimConfig(team_guaranteed=equal_guarantees(jobs, CLUSTER.total_gpus), **kw)


def _check_conservation(result, jobs):
    runs = result.state.jobs
    assert sorted(runs) == [j.id for j in jobs]
    assert all(r.state == "done" for r in runs.values())
    assert result.state.finished == len(jobs)  # each job counted once
    assert not result.state.pending and not result.state.running
    work = sum(r.spec.work * r.spec.gpus for r in runs.values())
    lost = sum(r.lost_gpu_seconds for r in runs.values())
    busy = sum(r.busy_gpu_seconds for r in runs.values())
    assert busy == pytest.approx(work + lost)
    m = compute_metrics(result)
    for r in runs.values():
        assert r.finish - r.spec.submit >= r.spec.work - 1e-6
        assert r.first_start >= r.spec.submit
    assert m["makespan"] >= m["bound_makespan"] - 1e-6
    assert m["jct_vs_bound"] >= 1.0
    assert 0 < m["utilization"] <= 1.0
    return m


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fcfs_with_reclaim_conserves_gpu_seconds(jobs, checkpointing):
    config = _config(jobs, restart_overhead=60, checkpointing=checkpointing)
    result = simulate(jobs, CLUSTER, PolicyDriver(get_policy("fcfs")), config)
    m = _check_conservation(result, jobs)
    assert m["preemptions"] > 0 and m["lost_gpu_seconds"] > 0
    assert m["invalid_decisions"] == 0


def test_oracle_conserves_and_preempts_for_free(jobs):
    result = simulate(jobs, CLUSTER, SrptOracle(), SimConfig(restart_overhead=60))
    m = _check_conservation(result, jobs)
    assert m["preemptions"] > 0 and m["lost_gpu_seconds"] == 0


def test_oracle_runs_the_short_arrival_first():
    # A 1000 s job holds the only GPU; a 10 s job arrives at 100: SRPT preempts A (free),
    # runs B 100..110, and A resumes with its 900 s left: ends at 1010.
    from .conftest import job

    one = parse_cluster("1x1xV100")
    result = simulate([job(1, 0, 1000), job(2, 100, 10)], one, SrptOracle(), SimConfig())
    runs = result.state.jobs
    assert (runs[2].finish, runs[1].finish) == (110, 1010)


def test_oracle_beats_fcfs_on_average_jct(jobs):
    fcfs = simulate(jobs, CLUSTER, PolicyDriver(get_policy("fcfs")), SimConfig())
    oracle = simulate(jobs, CLUSTER, SrptOracle(), SimConfig())
    assert compute_metrics(oracle)["jct_avg"] < compute_metrics(fcfs)["jct_avg"]


class _Recording(PolicyDriver):
    """Keeps every snapshot the simulator built and the plan the policy returned."""

    def __init__(self, policy):
        super().__init__(policy)
        self.seen = []

    def cycle(self, state):
        snapshot = state.snapshot()
        plan = self.policy.schedule(snapshot)
        self.seen.append((snapshot, plan))
        return apply_plan(state, plan)


@pytest.mark.parametrize("name", ["fcfs", "sjf", "greedy"])
def test_policy_called_directly_on_the_same_snapshot_decides_the_same(jobs, name):
    config = _config(jobs)
    recording = _Recording(get_policy(name))
    result = simulate(jobs, CLUSTER, recording, config)
    assert result.state.invalid_decisions == []
    fresh = get_policy(name)
    decided = [(s, p) for s, p in recording.seen if p.places or p.preempts]
    assert decided
    for snapshot, plan in decided[:: max(1, len(decided) // 25)]:
        assert fresh.schedule(snapshot) == plan


@pytest.mark.parametrize("name", ["fcfs", "priority", "sjf"])
def test_skipping_cycles_when_nothing_fits_changes_nothing_without_preemption(jobs, name):
    # No guarantees: these policies never preempt, so a cycle where no pending job fits
    # anywhere can decide nothing and skipping it must give the same run.
    full = simulate(jobs, CLUSTER, PolicyDriver(get_policy(name)), SimConfig(skip_exact=False))
    skip = simulate(jobs, CLUSTER, PolicyDriver(get_policy(name)), SimConfig(skip_when_full=True))
    assert skip.cycles < full.cycles
    finish = {i: (r.first_start, r.finish) for i, r in full.state.jobs.items()}
    assert {i: (r.first_start, r.finish) for i, r in skip.state.jobs.items()} == finish


# -- multi-node gangs, host CPUs and memory ---------------------------------------------

GANG_CLUSTER = parse_cluster("4x4xT4[cpus=16,mem=64,group=2]")


@pytest.fixture(scope="module")
def gang_jobs():
    """Jobs of 1 to 16 GPUs on 4-GPU nodes (8 and 16 become 2- and 4-node gangs), asking
    CPUs and memory in proportion, arriving fast enough to queue."""
    rng = np.random.default_rng(11)
    n = 120
    gpus = rng.choice([1, 2, 4, 8, 16], size=n, p=[0.4, 0.2, 0.15, 0.15, 0.1])
    durations = np.clip(rng.lognormal(np.log(600), 1.0, n), 30, 20000).round()
    submits = np.cumsum(rng.exponential(250, n))
    raw = [
        JobSpec(
            id=i + 1,
            submit=float(submits[i]),
            duration=float(durations[i]),
            gpus=int(gpus[i]),
            team=f"t{i % 3}",
            user=f"t{i % 3}",
            priority=int(i % 3 == 0),
        )
        for i in range(n)
    ]
    prepared, rep = prepare(
        raw,
        total_gpus=GANG_CLUSTER.total_gpus,
        max_node_gpus=4,
        cluster=GANG_CLUSTER,
        cpus_per_gpu=3,
        memory_gb_per_gpu=12,
        seed=11,
    )
    assert rep.ganged > 15 and rep.dropped_unfit == 0
    return prepared


class _GangFirstFit:
    """A test-only policy: strict priority then FIFO order (jobs in that order until one does
    not fit), each member on the first node with room (GPUs, CPUs, memory); when the first
    waiting job has waited 10 minutes and does not fit, it preempts the largest (then most
    recently started) running job of lower priority, so runs include gangs preempted and
    preempting."""

    name = "gang-first-fit"
    time_dependent = True

    def schedule(self, snap):
        free = {n.name: [g.index for g in n.gpus if g.is_whole_free] for n in snap.nodes}
        cpus = {n.name: n.free_cpus for n in snap.nodes}
        mem = {n.name: n.free_memory_mb for n in snap.nodes}
        places = []
        head = None
        order = sorted(snap.pending, key=lambda j: (-j.priority, j.submitted_at, j.id))
        for rank, job in enumerate(order):
            per = job.gpus_on_each_node
            hosts = [
                name
                for name in free
                if len(free[name]) >= per and cpus[name] >= job.cpus and mem[name] >= job.memory_mb
            ][: job.nodes]
            if len(hosts) < job.nodes:
                if rank == 0 and snap.now - job.submitted_at > 600:
                    head = job
                break
            members = []
            for name in hosts:
                members.append(Member(name, tuple(free[name][:per])))
                free[name] = free[name][per:]
                cpus[name] -= job.cpus
                mem[name] -= job.memory_mb
            places.append(
                Place(job.id, members[0].node, members[0].gpu_indices, "", tuple(members[1:]))
            )
        preempts = ()
        lower = [r for r in snap.running if head is not None and r.priority < head.priority]
        if lower and not places:
            victim = max(lower, key=lambda r: (r.gpus, r.started_at, r.id))
            preempts = (Preempt(victim.id, "make room for the oldest job"),)
        return Plan(self.name, places=tuple(places), preempts=preempts)


class _Checking:
    """Runs a driver and checks after every cycle that no GPU, CPU or MiB is double-booked
    and the snapshot's free figures are the nodes' minus what running jobs hold."""

    def __init__(self, driver):
        self.driver = driver
        self.name = driver.name
        self.checks = 0

    def cycle(self, state):
        applied = self.driver.cycle(state)
        _check_books(state)
        self.checks += 1
        return applied


def _check_books(state):
    held = {}
    cpus = {}
    mem = {}
    for r in state.running.values():
        assert len(r.allocations) == state.jobs[r.id].spec.nodes
        assert len({m.node for m in r.allocations}) == len(r.allocations)
        for m in r.allocations:
            assert len(m.gpu_indices) == (r.gpus // len(r.allocations) or 1)
            for i in m.gpu_indices:
                assert (m.node, i) not in held, f"GPU {m.node}/{i} double-booked"
                held[(m.node, i)] = r.id
            cpus[m.node] = cpus.get(m.node, 0) + r.cpus
            mem[m.node] = mem.get(m.node, 0) + r.memory_mb
    for n in state.node_states():
        for g in n.gpus:
            assert g.is_whole_free == ((n.name, g.index) not in held)
        assert 0 <= n.free_cpus == n.cpus - cpus.get(n.name, 0)
        assert 0 <= n.free_memory_mb == n.memory_mb - mem.get(n.name, 0)
    assert state.idle_gpus == state.total_gpus - len(held)


def _check_gang_run(result, jobs):
    state = result.state
    runs = state.jobs
    assert all(r.state == "done" for r in runs.values()), state.rejected
    assert not state.running and state.idle_gpus == state.total_gpus
    for n in state.node_states():  # every member released
        assert n.free_cpus == n.cpus and n.free_memory_mb == n.memory_mb
        assert all(g.is_whole_free for g in n.gpus)
    work = sum(r.spec.work * r.spec.gpus for r in runs.values())
    lost = sum(r.lost_gpu_seconds for r in runs.values())
    spread = sum(r.spread_gpu_seconds for r in runs.values())
    busy = sum(r.busy_gpu_seconds for r in runs.values())
    assert busy == pytest.approx(work + lost + spread)
    for r in runs.values():
        assert r.finish - r.spec.submit >= r.spec.work - 1e-6
    m = compute_metrics(result)
    assert m["makespan"] >= m["bound_makespan"] - 1e-6
    assert m["gangs"] == sum(j.nodes > 1 for j in jobs) > 15
    assert m["invalid_decisions"] == 0
    return m


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gangs_with_preemption_book_and_release_every_member(gang_jobs, checkpointing):
    driver = _Checking(PolicyDriver(_GangFirstFit()))
    config = SimConfig(restart_overhead=60, checkpointing=checkpointing)
    result = simulate(gang_jobs, GANG_CLUSTER, driver, config)
    m = _check_gang_run(result, gang_jobs)
    assert driver.checks > 100
    preempted = [r for r in result.state.jobs.values() if r.preemptions]
    assert any(r.spec.nodes > 1 for r in preempted)
    assert m["lost_gpu_seconds"] > 0 and m["preemptions_per_job"] > 0
    # Spread over two groups costs time: first fit crosses groups for some gangs.
    assert m["spread_gpu_seconds"] > 0
    assert m["gang_wait_gpu_seconds"] > 0


def test_gangs_without_spread_slowdown_cost_nothing_extra(gang_jobs):
    config = SimConfig(gang_spread_slowdown=0.0)
    result = simulate(gang_jobs, GANG_CLUSTER, PolicyDriver(_GangFirstFit()), config)
    assert _check_gang_run(result, gang_jobs)["spread_gpu_seconds"] == 0


def test_oracle_places_gangs_and_conserves(gang_jobs):
    driver = _Checking(SrptOracle())
    result = simulate(gang_jobs, GANG_CLUSTER, driver, SimConfig(restart_overhead=60))
    m = _check_gang_run(result, gang_jobs)
    assert m["preemptions"] > 0 and m["lost_gpu_seconds"] == 0
    fifo = simulate(gang_jobs, GANG_CLUSTER, PolicyDriver(_GangFirstFit()), SimConfig())
    assert m["jct_avg"] < compute_metrics(fifo)["jct_avg"]


def test_rl_baseline_places_gangs(gang_jobs):
    from scheduler.rl.baseline import CemDriver

    result = simulate(gang_jobs, GANG_CLUSTER, _Checking(CemDriver()), SimConfig())
    _check_gang_run(result, gang_jobs)
