"""The event loop with production policies, on traces small enough to work out by hand."""

import pytest

from scheduler.policies import get_policy
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.engine import PolicyDriver, simulate
from scheduler.sim.metrics import compute_metrics
from scheduler.sim.state import SimConfig, SimState

from .conftest import job

ONE_GPU = parse_cluster("1x1xV100")


def jcts(result):
    return {r.spec.id: r.finish - r.spec.submit for r in result.state.jobs.values()}


def run(policy, jobs, cluster=ONE_GPU, **config):
    return simulate(jobs, cluster, PolicyDriver(get_policy(policy)), SimConfig(**config))


# Two jobs arrive together on one GPU: A (id 1) needs 100 s and asks for 200 s,
# B (id 2) needs 20 s and asks for 40 s. Without a predictor a policy sees only the limits.
TWO = [job(1, 0, 100, time_limit=200), job(2, 0, 20, time_limit=40)]


def test_fcfs_by_hand():
    # FCFS runs A first: A 0..100, B 100..120 -> JCTs 100 and 120, avg 110.
    result = run("fcfs", TWO)
    assert jcts(result) == {1: 100, 2: 120}
    assert compute_metrics(result)["jct_avg"] == 110


def test_sjf_by_hand():
    # SJF runs B (limit 40 < 200) first: B 0..20, A 20..120 -> JCTs 20 and 120, avg 70.
    result = run("sjf", TWO)
    assert jcts(result) == {1: 120, 2: 20}
    assert compute_metrics(result)["jct_avg"] == 70


def test_later_arrival_waits_for_the_running_job():
    # A starts at 0 alone; B arrives at 10 and, policies being non-preemptive here, waits
    # until 100: JCT(A) = 100, JCT(B) = 120 - 10 = 110, queueing delay of B 90.
    jobs = [job(1, 0, 100), job(2, 10, 20)]
    for policy in ("fcfs", "sjf"):
        result = run(policy, jobs)
        assert jcts(result) == {1: 100, 2: 110}
        assert compute_metrics(result)["queue_p99"] == pytest.approx(89.1)


def test_gang_waits_for_a_whole_node():
    # Two 2-GPU nodes and three singles: best fit puts jobs 1 and 2 on the first node and
    # job 3 on the second. When job 1 ends at 50 each node has one free GPU, which does not
    # hold the gang; when job 2 ends at 60 the first node is whole again and the gang starts.
    cluster = parse_cluster("2x2xV100")
    jobs = [job(1, 0, 50), job(2, 0, 60), job(3, 0, 70), job(4, 1, 30, gpus=2)]
    state = SimState(jobs, cluster, SimConfig())
    state.advance(0)
    nodes = [n.name for n in cluster.nodes]
    assert state.start(1, nodes[0], (0,)) is None
    assert state.start(2, nodes[1], (0,)) is None
    state.advance(1)
    assert state.start(4, nodes[0], (0, 1)) is not None  # GPU 0 is taken
    result = run("fcfs", jobs, cluster)
    gang = result.state.jobs[4]
    assert (gang.first_start, gang.finish, gang.node) == (60, 90, nodes[0])


def test_preemption_loses_progress_and_pays_the_restart_overhead():
    # A (100 s of work) runs 0..30 and is preempted: 30 GPU-s lost. Restarted at 40 it
    # first spends 60 s restarting, then 100 s working: it ends at 200, 90 GPU-s lost in all.
    state = SimState([job(1, 0, 100)], ONE_GPU, SimConfig(restart_overhead=60))
    node = ONE_GPU.nodes[0].name
    state.advance(0)
    state.start(1, node, (0,))
    state.advance(30)
    assert state.preempt(1) is None
    assert 1 in state.pending and state.pending[1].attained_service == 30
    assert state.pending[1].time_limit == 200 + 60  # the next attempt may run its overhead too
    state.advance(40)
    state.start(1, node, (0,))
    assert state.next_event_time() == 200
    state.advance(200)
    run_ = state.jobs[1]
    assert (run_.state, run_.finish, run_.preemptions) == ("done", 200, 1)
    assert run_.lost_gpu_seconds == 90
    assert run_.busy_gpu_seconds == 30 + 160


def test_checkpointing_keeps_progress():
    # Same as above with checkpoints: 30 s of work kept, restart 40 + 60 + 70 = 170.
    state = SimState([job(1, 0, 100)], ONE_GPU, SimConfig(restart_overhead=60, checkpointing=True))
    node = ONE_GPU.nodes[0].name
    state.advance(0)
    state.start(1, node, (0,))
    state.advance(30)
    state.preempt(1)
    state.advance(40)
    state.start(1, node, (0,))
    assert state.next_event_time() == 170
    state.advance(170)
    assert state.jobs[1].lost_gpu_seconds == 60


def test_preempt_without_requeue_ends_the_job():
    state = SimState([job(1, 0, 100)], ONE_GPU, SimConfig())
    state.advance(0)
    state.start(1, ONE_GPU.nodes[0].name, (0,))
    state.advance(5)
    state.preempt(1, requeue=False)
    assert state.jobs[1].state == "killed" and not state.pending and not state.running


def test_job_over_its_time_limit_is_stopped_at_the_limit():
    result = run("fcfs", [job(1, 0, 500, time_limit=120)])
    r = result.state.jobs[1]
    assert (r.state, r.finish) == ("timeout", 120)


def test_job_larger_than_any_node_is_refused_at_admission():
    result = run("fcfs", [job(1, 0, 10, gpus=4), job(2, 0, 10)])
    states = {r.spec.id: r.state for r in result.state.jobs.values()}
    assert states == {1: "rejected", 2: "done"}
    assert compute_metrics(result)["rejected"] == 1
    assert "largest node has 1" in result.state.rejected[0]


class _NeverPlaces:
    name = "never"

    def schedule(self, snapshot):
        from scheduler.core.model import Plan

        return Plan("never", order=tuple(j.id for j in snapshot.pending))


def test_jobs_a_policy_never_starts_end_as_unschedulable_instead_of_looping():
    result = simulate([job(1, 0, 10)], ONE_GPU, PolicyDriver(_NeverPlaces()), SimConfig())
    assert result.state.jobs[1].state == "unschedulable"
    assert compute_metrics(result)["unschedulable"] == 1


def test_invalid_decisions_are_skipped_not_forced():
    state = SimState([job(1, 0, 10), job(2, 0, 10)], ONE_GPU, SimConfig())
    state.advance(0)
    node = ONE_GPU.nodes[0].name
    assert state.start(1, node, (0,)) is None
    assert "not free" in state.start(2, node, (0,))
    assert "unknown node" in state.start(2, "nowhere", (0,))
    assert state.preempt(2) == "job 2 is not running"
    assert list(state.running) == [1] and list(state.pending) == [2]


def test_team_usage_decays_with_the_settings_half_life():
    import math

    # One GPU busy for one half-life h from 0: usage = integral of 2^(-(h-t)/h) dt over
    # [0, h] = h / ln 2 x (1 - 1/2). After another idle half-life it halves.
    h = 1000.0
    state = SimState([job(1, 0, h)], ONE_GPU, SimConfig(settings={"fairshare_half_life": h}))
    state.advance(0)
    state.start(1, ONE_GPU.nodes[0].name, (0,))
    state.advance(h)
    used = h / math.log(2) * 0.5
    assert state.snapshot().teams["a"].decayed_usage == pytest.approx(used)
    state.advance(2 * h)
    assert state.snapshot().teams["a"].decayed_usage == pytest.approx(used / 2)


def test_a_replay_pauses_the_cyclic_collector_and_gives_it_back_as_it_was(monkeypatch):
    import gc

    from scheduler.sim import engine

    seen = []

    class Watching(PolicyDriver):
        def cycle(self, state):
            seen.append(gc.isenabled())
            return super().cycle(state)

    young = []
    monkeypatch.setattr(engine, "GC_YOUNG_EVERY", 2)
    real_collect = gc.collect
    monkeypatch.setattr(engine.gc, "collect", lambda generation=2: young.append(generation))
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            seen.clear()
            simulate(TWO, ONE_GPU, Watching(get_policy("fcfs")), SimConfig())
            assert seen and not any(seen)  # paused during the run
            assert gc.isenabled() is enabled  # and as it was after
    finally:
        gc.enable()
        monkeypatch.setattr(engine.gc, "collect", real_collect)
    assert young and set(young) == {1}  # only the young generations, every few steps
