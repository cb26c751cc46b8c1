from scheduler.policies import get_policy
from scheduler.policies.priority import priority_order
from tests.scheduler.core.builders import job, node, placed, running, snap, team, waits


def test_fcfs_blocks_behind_a_head_that_does_not_fit():
    s = snap(
        [node("a", 4)], [job(1, 4, submitted=0), job(2, 1, submitted=5)], [running(9, "a", (0, 1))]
    )
    plan = get_policy("fcfs").schedule(s)
    assert placed(plan) == {}
    assert plan.order == (1, 2)
    assert waits(plan)[1].startswith("needs 4 GPUs on one node; the largest free block is 2 on a")
    assert waits(plan)[2] == "queued behind job 1, which does not fit yet"


def test_fcfs_starts_in_submit_order_when_all_fit():
    s = snap([node("a", 4)], [job(2, 2, submitted=5), job(1, 2, submitted=0)])
    plan = get_policy("fcfs").schedule(s)
    assert [p.job_id for p in plan.places] == [1, 2]


def test_sjf_orders_by_predicted_runtime():
    pending = [
        job(1, 1, limit=7200, predicted_runtime=3000),
        job(2, 1, limit=1800),
        job(3, 1, limit=36000, predicted_runtime=600),
    ]
    plan = get_policy("sjf").schedule(snap([node("a", 2)], pending))
    assert plan.order == (3, 2, 1)
    assert set(placed(plan)) == {3, 2}


def test_priority_orders_by_the_weights():
    teams = [team("hi", priority_weight=2.0), team("lo", priority_weight=1.0)]
    pending = [
        job(1, 1, team="lo", submitted=0),  # oldest
        job(2, 1, team="hi", submitted=900),  # heavier team
        job(3, 1, team="lo", submitted=900, qos="high"),
    ]
    only_age = {f"priority_weight_{k}": 0 for k in ("fairshare", "team", "qos", "size", "job")}
    order = [
        j.id for j in priority_order(snap([node("a")], pending, teams=teams, settings=only_age))
    ]
    assert order[0] == 1
    only_team = {f"priority_weight_{k}": 0 for k in ("fairshare", "age", "qos", "size", "job")}
    order = [
        j.id for j in priority_order(snap([node("a")], pending, teams=teams, settings=only_team))
    ]
    assert order[0] == 2
    only_qos = {f"priority_weight_{k}": 0 for k in ("fairshare", "age", "team", "size", "job")}
    order = [
        j.id for j in priority_order(snap([node("a")], pending, teams=teams, settings=only_qos))
    ]
    assert order[0] == 3


def test_priority_fairshare_favours_the_team_below_its_share():
    teams = [team("heavy", decayed_usage=9e5), team("light", decayed_usage=1e5)]
    pending = [job(1, 1, team="heavy"), job(2, 1, team="light")]
    plan = get_policy("priority").schedule(snap([node("a", 1)], pending, teams=teams))
    assert placed(plan) == {2: ("a", (0,))}


def test_priority_job_priority_and_size():
    pending = [job(1, 1, priority=0), job(2, 1, priority=50), job(3, 8)]
    settings = {
        "priority_weight_age": 0,
        "priority_weight_fairshare": 0,
        "priority_weight_team": 0,
        "priority_weight_qos": 0,
    }
    order = [j.id for j in priority_order(snap([node("a")], pending, settings=settings))]
    assert order == [3, 2, 1]  # size factor 100 beats 50 priority points
    settings["priority_favor_small"] = True
    order = [j.id for j in priority_order(snap([node("a")], pending, settings=settings))]
    assert order == [2, 1, 3]


def test_priority_reserves_for_the_top_job_so_it_is_not_starved():
    pending = [job(1, 4, priority=100, submitted=0), job(2, 1, limit=7200, submitted=1)]
    run = [running(9, "a", (0, 1), limit=3600)]
    s = snap([node("a", 4)], pending, run)
    plan = get_policy("priority").schedule(s)
    assert [(r.job_id, r.start) for r in plan.reserves] == [(1, 3600)]
    assert placed(plan) == {}  # job 2 would end after the reservation starts
    off = snap([node("a", 4)], pending, run, settings={"priority_reservation": False})
    assert set(placed(get_policy("priority").schedule(off))) == {2}


def test_las_runs_least_attained_first_and_preempts_long_runners():
    run = [running(9, "a", (0, 1), started=0, attained_service=400_000)]
    pending = [job(1, 2, attained_service=50_000, submitted=0), job(2, 2, submitted=10)]
    plan = get_policy("las").schedule(snap([node("a", 2)], pending, run))
    assert plan.order == (2, 1)
    assert [p.job_id for p in plan.preempts] == [9]
    # The whole reason, the gain check's part included (written only for victims chosen).
    assert plan.preempts[0].reason == (
        "preempted for job 2: least attained service: it is in queue 4, job 2 in queue 1; "
        "expected to need 112 GPU-h more against 0 GPU-h, which beats 8 x the preemption's "
        "cost of 0.589 GPU-h (60 s restart + 17 min of progress without a checkpoint)"
    )
    assert waits(plan)[2] == "waiting for 1 preempted job to release GPUs on a"
    # A job in the same queue as the runner does not preempt it.
    plan = get_policy("las").schedule(
        snap([node("a", 2)], [pending[0]], [running(9, "a", (0, 1), started=990)])
    )
    assert plan.preempts == ()
