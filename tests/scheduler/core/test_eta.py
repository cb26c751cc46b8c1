from scheduler.core.eta import estimate, what_if
from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, running, snap


def _fleet(*pending):
    run = [
        running(8, "a", (0, 1), started=0, limit=3600),
        running(9, "a", (2, 3), started=0, limit=3600, predicted_runtime=2000),
    ]
    return snap([node("a", 4)], pending, run, now=1000.0)


def test_positions_and_etas_follow_expected_ends():
    s = _fleet(job(1, 2, submitted=0, limit=5000), job(2, 4, submitted=1), job(3, 2, submitted=2))
    out = estimate(s, get_policy("fcfs"))
    assert out[1][:2] == (1, 2000)  # job 9 is predicted to end at 2000
    assert out[2][:2] == (2, 7000)  # needs the whole node: after job 1 ends (2000 + 5000)
    assert out[3][:2] == (3, 10600)  # fcfs: behind job 2, which holds the node 3600 s


def test_blocking_policy_keeps_later_jobs_behind_the_head():
    s = _fleet(job(1, 4, submitted=0, limit=100), job(2, 2, submitted=1, limit=100))
    fcfs = estimate(s, get_policy("fcfs"))
    sjf = estimate(s, get_policy("sjf"))
    assert fcfs[1][1] == 3600 and fcfs[2][1] == 3700
    assert sjf[2][1] == 2000  # not blocked: takes the first two GPUs to free up


def test_estimate_is_capped():
    s = _fleet(*[job(i, 2, submitted=i, limit=3600) for i in range(1, 30)])
    out = estimate(s, get_policy("fcfs"), max_events=3)
    assert out[29][1] is None
    assert "no estimate within the forecast window" in out[29][2]


def test_what_if_now_later_and_never():
    s = _fleet()
    assert what_if(s, get_policy("fcfs"), job(1, 4, limit=60))[:3] == (False, None, 3600)
    free = snap([node("a", 4)], now=5.0)
    assert what_if(free, get_policy("fcfs"), job(1, 4)) == (True, "a", 5.0, "would start now on a")
    never = what_if(s, get_policy("fcfs"), job(1, 16))
    assert never == (False, None, None, "needs 16 GPUs on one node; the largest node has 4")


def test_a_preempted_jobs_gpus_go_to_the_plans_placement_not_twice():
    from scheduler.core.model import Place, Plan, Preempt

    # One node of 2 GPUs, both held by job 8 (ends at 3600). The plan preempts it and
    # places job 1 on its GPUs; job 2 must wait for job 1 (limit 600), not start now too.
    s = snap(
        [node("a", 2)],
        [job(1, 2, submitted=0, limit=600), job(2, 2, submitted=1, limit=600)],
        [running(8, "a", (0, 1), started=0, limit=3600)],
        now=1000.0,
    )
    plan = Plan(
        "test",
        places=(Place(1, "a", (0, 1)),),
        preempts=(Preempt(8, "for job 1"),),
        order=(1, 2),
    )
    out = estimate(s, get_policy("fcfs"), plan=plan)
    assert out[1][1] == 1000.0
    assert out[2][1] == 1600.0


def test_a_running_job_past_its_predicted_end_is_expected_at_the_learned_conditional_median():
    from dataclasses import replace

    # Job 8 was predicted to use 300 s of its 1,000 s limit but is still running at 500 s.
    s = snap(
        [node("a", 2)],
        [job(1, 2, submitted=0, limit=600)],
        [running(8, "a", (0, 1), started=0, limit=1000, predicted_runtime=300)],
        now=500.0,
    )
    # No history of actual/limit ratios: it may use its whole limit.
    assert estimate(s, get_policy("fcfs"))[1][1] == 1000.0
    # Finished jobs used 10%..100% of their limits: of those above 50%, the median is 80%.
    learned = replace(s, limit_ratio_distribution=tuple(i / 10 for i in range(1, 11)))
    assert estimate(learned, get_policy("fcfs"))[1][1] == 800.0


def test_a_job_the_plan_preempts_for_is_expected_once_the_victim_has_stopped():
    from scheduler.core.model import Plan, Preempt

    # Job 8 holds both GPUs until 3600; the plan preempts it for job 1, which starts in the
    # next cycle (the victim stops first), not when job 8 would have ended.
    s = snap(
        [node("a", 2)],
        [job(1, 2, submitted=0, limit=600), job(2, 2, submitted=1, limit=600)],
        [running(8, "a", (0, 1), started=0, limit=3600)],
        now=1000.0,
    )
    plan = Plan("test", preempts=(Preempt(8, "for job 1"),), order=(1, 2))
    out = estimate(s, get_policy("fcfs"), plan=plan)
    assert out[1][1] == 1060.0
    assert out[2][1] == 1660.0
    assert estimate(s, get_policy("fcfs"), plan=plan, preempt_delay=10.0)[1][1] == 1010.0
