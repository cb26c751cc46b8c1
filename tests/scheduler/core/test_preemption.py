from dataclasses import replace

from scheduler.core.placement import FreeCapacity
from scheduler.core.preemption import choose_victims
from scheduler.core.preemption_cost import PreemptionCost, mean_residual
from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, placed, running, snap, team, waits

TEAMS = [team("lab", guaranteed_gpus=4), team("big", guaranteed_gpus=0)]


def test_victim_chosen_to_lose_least_work():
    # Both 2-GPU borrowers free enough; the one started last has done the least work.
    run = [
        running(1, "a", (0, 1), team="big", started=0),
        running(2, "a", (2, 3), team="big", started=900),
    ]
    s = snap([node("a", 4)], [job(10, 2, team="lab")], run, teams=TEAMS)
    victims = choose_victims(job(10, 2, team="lab"), FreeCapacity.from_snapshot(s), run, s.now)
    assert [v.id for v in victims.jobs] == [2]
    assert victims.gpu_indices == (2, 3)


def test_fewest_victims_that_free_enough_on_one_node():
    run = [
        running(1, "a", (0,), team="big", started=500),
        running(2, "a", (1,), team="big", started=500),
        running(3, "a", (2, 3), team="big", started=400),
        running(4, "b", (0, 1), team="big", started=0),
    ]
    s = snap([node("a", 4), node("b", 2)], [job(10, 2, team="lab")], run, teams=TEAMS)
    victims = choose_victims(job(10, 2, team="lab"), FreeCapacity.from_snapshot(s), run, s.now)
    # Jobs 1+2 lose 2 x 500 GPU-s, job 3 loses 2 x 600 and job 4 2 x 1000.
    assert victims.node == "a" and {v.id for v in victims.jobs} == {1, 2}


def test_team_under_guarantee_reclaims_from_borrower_and_waits():
    run = [
        running(1, "sim-a", (0, 1), team="big", started=0, requeueable=False),
        running(2, "sim-a", (2, 3), team="big", started=900, preemptible=False),
    ]
    s = snap([node("sim-a", 4)], [job(10, 2, team="lab")], run, teams=TEAMS)
    plan = get_policy("priority").schedule(s)
    assert [(p.job_id, p.requeue) for p in plan.preempts] == [(1, False)]
    assert (
        "team lab reclaims its guaranteed GPUs from borrowing team big" in plan.preempts[0].reason
    )
    assert waits(plan)[10] == "waiting for 1 preempted job to release GPUs on sim-a"
    assert placed(plan) == {}


def test_no_reclaim_beyond_the_guarantee_and_no_qos_preemption_unless_enabled():
    run = [running(1, "a", (0, 1, 2, 3), team="big", qos="low")]
    over = [job(10, 4, team="lab", qos="high", submitted=1), job(11, 2, team="lab")]
    teams = [team("lab", guaranteed_gpus=1), team("big")]
    s = snap([node("a", 4)], over, run, teams=teams)
    assert get_policy("priority").schedule(s).preempts == ()
    s = snap([node("a", 4)], over, run, teams=teams, settings={"qos_preemption": True})
    plan = get_policy("priority").schedule(s)
    assert [p.job_id for p in plan.preempts] == [1]
    assert "QoS high preempts QoS low" in plan.preempts[0].reason
    # The GPUs the victim frees are promised to job 10, not to job 11 behind it.
    assert placed(plan) == {}


def test_gang_victims_share_the_gangs_node():
    run = [running(1, "a", (0, 1), team="big"), running(2, "b", (0, 1), team="big")]
    s = snap([node("a", 2), node("b", 2)], [job(10, 4, team="lab")], run, teams=TEAMS)
    victims = choose_victims(job(10, 4, team="lab"), FreeCapacity.from_snapshot(s), run, s.now)
    assert victims is None


# -- what a preemption costs, and when it pays ----------------------------------------------------

HOUR = 3600.0


def test_cost_counts_restart_and_progress_lost_without_or_since_the_checkpoint():
    victim = running(1, "a", (0, 1), started=0.0)
    plain = PreemptionCost(restart_overhead=60.0)
    assert plain.lost_seconds(victim, 1000.0) == 1000.0
    assert plain.gpu_seconds(victim, 1000.0) == 2 * 1060.0
    every_10_min = PreemptionCost(restart_overhead=60.0, checkpoints=True, checkpoint_interval=600)
    assert every_10_min.lost_seconds(victim, 1000.0) == 400.0
    continuous = PreemptionCost(checkpoints=True, checkpoint_interval=0.0)
    assert continuous.gpu_seconds(victim, 1000.0) == 2 * 60.0
    settings = {"preemption_checkpoints": True, "preemption_checkpoint_interval": 600}
    assert PreemptionCost.from_settings(settings) == PreemptionCost(
        checkpoints=True, checkpoint_interval=600.0
    )


def test_victims_ranked_by_cost_prefer_a_fresh_checkpoint():
    # Job 1 ran 1100 s, 500 s past its checkpoint at 600; job 2 ran 1250 s, 50 s past 1200.
    run = [running(1, "a", (0,), started=0.0), running(2, "b", (0,), started=-150.0)]
    s = snap([node("a", 1), node("b", 1)], [job(10)], run, now=1100.0)
    cap = FreeCapacity.from_snapshot(s)
    assert [v.id for v in choose_victims(job(10), cap, run, s.now).jobs] == [1]
    costs = PreemptionCost(checkpoints=True, checkpoint_interval=600.0)
    found = choose_victims(job(10), cap, run, s.now, cost=costs.gpu_seconds)
    assert [v.id for v in found.jobs] == [2]


def test_mean_residual_of_equal_mass_atoms():
    atoms = (10.0, 100.0, 1000.0)
    assert mean_residual(atoms, 0.0) == 370.0
    assert mean_residual(atoms, 50.0) == (50.0 + 950.0) / 2
    assert mean_residual(atoms, 50.0, cap=200.0) == (50.0 + 150.0) / 2
    assert mean_residual(atoms, 5000.0) == 5000.0  # past every atom: as much again
    assert mean_residual((), 300.0, cap=400.0) == 100.0


def _las(pending, run, now, **settings):
    return get_policy("las").schedule(
        snap([node("a", 1)], pending, run, settings=settings, now=now)
    )


def test_las_preempts_only_when_the_gain_beats_the_cost():
    # The victim ran 2 h (queue 2), the waiting job is fresh (queue 1). Without a checkpoint
    # the restart throws away 2 h + 60 s, more than the 2 h the victim is expected to need.
    victim = running(7, "a", (0,), started=0.0)
    fresh = [job(1, submitted=100.0)]
    assert _las(fresh, [victim], 2 * HOUR).preempts == ()
    assert [
        p.job_id for p in _las(fresh, [victim], 2 * HOUR, preemption_gain_check=False).preempts
    ] == [7]
    # With checkpoints only the 60 s restart is lost: it pays, and the reason says why.
    plan = _las(fresh, [victim], 2 * HOUR, preemption_checkpoints=True)
    assert [p.job_id for p in plan.preempts] == [7]
    assert "beats 8 x the preemption's cost of 0.0167 GPU-h" in plan.preempts[0].reason
    # A victim that attained 10 GPU-hours before is expected to need more: it pays even
    # without checkpoints.
    long = replace(victim, started_at=6000.0, attained_service=10 * HOUR)
    assert [p.job_id for p in _las(fresh, [long], 2 * HOUR).preempts] == [7]


def test_a_job_preempted_max_per_job_times_is_not_preempted_again():
    victim = running(7, "a", (0,), started=0.0, attained_service=10 * HOUR, preemptions=9)
    fresh = [job(1, submitted=100.0)]
    assert [p.job_id for p in _las(fresh, [victim], HOUR).preempts] == [7]
    capped = replace(victim, preemptions=10)
    assert _las(fresh, [capped], HOUR).preempts == ()
    assert _las(fresh, [capped], HOUR, preemption_max_per_job=11).preempts != ()
    assert _las(fresh, [victim], HOUR, preemption_max_per_job=3).preempts == ()
    assert _las(fresh, [capped], HOUR, preemption_max_per_job=0).preempts != ()  # no cap
    # The cap holds for every reason to preempt, a team reclaiming its guarantee too.
    teams = [team("lab", guaranteed_gpus=1), team("big")]
    borrower = replace(capped, team="big")
    s = snap([node("a", 1)], [job(1, team="lab")], [borrower], teams=teams, now=HOUR)
    assert get_policy("priority").schedule(s).preempts == ()
    s = snap([node("a", 1)], [job(1, team="lab")], [replace(borrower, preemptions=0)], teams=teams)
    assert [p.job_id for p in get_policy("priority").schedule(s).preempts] == [7]


def test_the_cost_weight_decides_close_calls():
    # Ran 1 h now after 2 GPU-hours before: expected to need 3 h more; the restart would
    # throw away 1 h + 60 s.
    victim = running(7, "a", (0,), started=HOUR, attained_service=2 * HOUR)
    fresh = [job(1, submitted=100.0)]
    assert _las(fresh, [victim], 2 * HOUR).preempts == ()  # 8 x 1 h > 3 h
    plan = _las(fresh, [victim], 2 * HOUR, preemption_cost_weight=1)
    assert [p.job_id for p in plan.preempts] == [7]
    assert "beats the preemption's cost of 1.02 GPU-h (60 s restart + 60 min of progress" in (
        plan.preempts[0].reason
    )


def test_gang_victims_free_whole_nodes_chosen_by_cost():
    # A 2 x 4-GPU gang on three full 4-GPU nodes: it needs two whole nodes freed.
    run = [
        running(1, "a", (0, 1, 2, 3), started=0.0),  # ran 1000 s, 100 s past a checkpoint
        running(2, "b", (0, 1, 2, 3), started=900.0),  # ran 100 s
        running(3, "c", (0, 1, 2, 3), started=500.0),  # ran 500 s, 200 s past a checkpoint
    ]
    gang = job(10, 8, gpus_per_node=4)
    s = snap([node("a", 4), node("b", 4), node("c", 4)], [gang], run, now=1000.0)
    cap = FreeCapacity.from_snapshot(s)
    plain = choose_victims(gang, cap, run, s.now, cost=PreemptionCost().gpu_seconds)
    assert {v.id for v in plain.jobs} == {2, 3}
    assert {m.node for m in plain.allocations} == {"b", "c"}
    every_5_min = PreemptionCost(checkpoints=True, checkpoint_interval=300.0)
    found = choose_victims(gang, cap, run, s.now, cost=every_5_min.gpu_seconds)
    assert {v.id for v in found.jobs} == {1, 2}
    assert {m.node for m in found.allocations} == {"a", "b"}
    assert all(len(m.gpu_indices) == 4 for m in found.allocations)
