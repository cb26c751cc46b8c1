from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, placed, running, snap, team, waits


def test_hard_limit_allows_borrowing_up_to_the_limit_only():
    teams = [team("t", guaranteed_gpus=2, hard_limit_gpus=5)]
    s = snap([node("a")], [job(1, 2), job(2, 2), job(3, 1)], [running(9, "a", (0, 1))], teams=teams)
    plan = get_policy("sjf").schedule(s)
    # In order: 2 running + job 1 = 4; job 2 would make 6; job 3 makes 5.
    assert set(placed(plan)) == {1, 3}
    assert waits(plan)[2] == "team t uses 4 of its hard limit of 5 GPUs; this job needs 2"


def test_per_user_cap_holds_while_other_users_run():
    teams = [team("t", user_gpu_cap=2)]
    s = snap(
        [node("a")],
        [job(1, 2, user="ada"), job(2, 1, user="ada"), job(3, 2, user="bob")],
        teams=teams,
    )
    plan = get_policy("fcfs").schedule(s)
    assert set(placed(plan)) == {1, 3}
    assert waits(plan)[2] == (
        "user ada uses 2 of the per-user cap of 2 GPUs in team t; this job needs 1"
    )


def test_quota_wait_does_not_block_fcfs():
    teams = [team("x", hard_limit_gpus=1)]
    s = snap([node("a", 2)], [job(1, 2, team="x"), job(2, 2, submitted=5)], teams=teams)
    plan = get_policy("fcfs").schedule(s)
    assert placed(plan) == {2: ("a", (0, 1))}
