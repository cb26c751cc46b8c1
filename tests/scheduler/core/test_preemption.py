from scheduler.core.placement import FreeCapacity
from scheduler.core.preemption import choose_victims
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
