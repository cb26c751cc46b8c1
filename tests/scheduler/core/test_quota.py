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


def test_ledger_counts_cpus_and_memory_on_every_node_of_a_gang():
    from scheduler.core.model import Member
    from scheduler.core.quota import QuotaLedger

    teams = {"vision": team("vision", hard_limit_cpus=64, hard_limit_memory_mb=300_000)}
    gang = running(
        1,
        "a",
        (0, 1, 2, 3),
        team="vision",
        gpus=8,
        gpus_per_node=4,
        members=(Member("b", (0, 1, 2, 3)),),
        cpus=16,
        memory_mb=100_000,
    )
    ledger = QuotaLedger(teams, [gang, running(2, "c", (0,), team="vision")])
    # Two nodes of 16 CPUs; the job asking nothing adds nothing.
    assert ledger.cpus("vision") == 32
    assert ledger.memory_mb("vision") == 200_000
    # A 2-node gang asking 20 CPUs per node holds 40: 32 + 40 = 72 > 64.
    more = job(3, 8, team="vision", gpus_per_node=4, cpus=20)
    assert ledger.check(more) == "team vision would use 72 of its 64 CPUs; this job needs 40"
    assert ledger.check(job(4, 1, team="vision", cpus=32)) is None
    big_memory = job(5, 4, team="vision", memory_mb=100_001)
    assert ledger.check(big_memory) == (
        "team vision would use 300001 of its 300000 MB of host memory; this job needs 100001 MB"
    )
    ledger.release(gang)
    assert (ledger.cpus("vision"), ledger.memory_mb("vision")) == (0, 0)
    assert ledger.check(more) is None
    ledger.take(more)
    assert ledger.cpus("vision") == 40
    # Another team's limits are its own.
    assert ledger.check(job(6, 1, team="other", cpus=500)) is None


def test_admission_refuses_a_job_above_its_teams_cpu_or_memory_limit():
    from scheduler.core.admission import admission_error

    nodes = [node("a", cpus=128, memory_mb=1_000_000), node("b", cpus=128, memory_mb=1_000_000)]
    limits = team("vision", hard_limit_cpus=64, hard_limit_memory_mb=200_000)
    gang = job(1, 16, team="vision", gpus_per_node=8, cpus=40)
    assert admission_error(gang, nodes, limits) == (
        "needs 80 CPU cores over all its nodes; team vision's limit is 64 CPU cores"
    )
    assert admission_error(job(2, 8, team="vision", cpus=64), nodes, limits) is None
    heavy = job(3, 16, team="vision", gpus_per_node=8, memory_mb=150_000)
    assert admission_error(heavy, nodes, limits) == (
        "needs 300000 MB of host memory over all its nodes; team vision's limit is 200000 MB"
    )
    assert admission_error(gang, nodes, team("vision")) is None


def test_priority_policy_keeps_a_team_within_its_cpu_limit():
    teams = [team("vision", hard_limit_cpus=64), team("nlp")]
    nodes = [node(n, cpus=128, memory_mb=1_000_000) for n in ("a", "b", "c", "d")]
    s = snap(
        nodes,
        [
            job(1, 8, team="vision", cpus=32),
            job(2, 8, team="vision", cpus=32, submitted=1),
            job(3, 8, team="vision", cpus=8, submitted=2),
            job(4, 8, team="nlp", cpus=100, submitted=3),
        ],
        teams=teams,
    )
    plan = get_policy("priority").schedule(s)
    assert set(placed(plan)) == {1, 2, 4}
    assert waits(plan)[3] == "team vision would use 72 of its 64 CPUs; this job needs 8"
