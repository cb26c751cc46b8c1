"""Whole runs: every job ends exactly once, GPU-seconds add up, bounds hold, and the
simulator asks production policies exactly what the production cycle would."""

import pytest

from scheduler.policies import get_policy
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.engine import PolicyDriver, apply_plan, simulate
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
