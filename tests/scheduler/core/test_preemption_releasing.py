"""A job that preempted in an earlier cycle waits while its victims still stop.

In production a victim's GPUs stay held until its process has ended (its grace period), so
the next cycle still finds no room for the job the preemption was for; without
`Snapshot.releasing_for` it would preempt another set of victims for the same job, every
cycle, until the first set is gone."""

from dataclasses import replace
from types import MappingProxyType

from scheduler.core.model import NodeState
from scheduler.policies import get_policy
from tests.scheduler.core.builders import job, node, placed, running, snap, team, waits

HOUR = 3600.0
TEAMS = [team("lab", guaranteed_gpus=4), team("big", guaranteed_gpus=0)]


def _releasing(s, **for_jobs):  # type: ignore[no-untyped-def]
    return replace(s, releasing_for=MappingProxyType({int(k[1:]): v for k, v in for_jobs.items()}))


def _held(n: NodeState, *indices: int) -> NodeState:
    """The node with these GPUs held by a stopping attempt (taken, as production counts them)."""
    gpus = tuple(
        replace(g, free_memory_mb=0, free_compute_percent=0) if g.index in indices else g
        for g in n.gpus
    )
    return replace(n, gpus=gpus)


def test_a_reclaiming_team_waits_for_the_gpus_it_already_freed() -> None:
    run = [
        running(1, "a", (0, 1), team="big", started=0),
        running(2, "b", (0, 1), team="big", started=0),
    ]
    s = snap([node("a", 2), node("b", 2)], [job(10, 2, team="lab")], run, teams=TEAMS)
    first = get_policy("priority").schedule(s)
    assert [(p.job_id, p.for_job) for p in first.preempts] == [(1, 10)]
    # The next cycle: job 1 still stops on a, whose GPUs it holds.
    nodes = [_held(node("a", 2), 0, 1), node("b", 2)]
    s = snap(nodes, [job(10, 2, team="lab")], run[1:], teams=TEAMS)
    assert [p.job_id for p in get_policy("priority").schedule(s).preempts] == [2]
    again = get_policy("priority").schedule(_releasing(s, j10=("a",)))
    assert again.preempts == () and placed(again) == {}
    assert waits(again)[10] == "waiting for jobs preempted for it to release GPUs on a"


def test_only_the_job_the_gpus_are_released_for_waits_for_them() -> None:
    run = [
        running(1, "a", (0, 1), team="big", started=0),
        running(2, "b", (0, 1), team="big", started=0),
    ]
    pending = [job(10, 2, team="lab"), job(11, 2, team="lab", submitted=1.0)]
    s = snap([node("a", 2), node("b", 2)], pending, run, teams=TEAMS)
    # Job 10 waits for b; job 11, within the guarantee too, still reclaims a for itself.
    plan = get_policy("priority").schedule(_releasing(s, j10=("b",)))
    assert [(p.job_id, p.for_job) for p in plan.preempts] == [(1, 11)]


def test_a_gittins_preemption_is_not_repeated_while_its_victim_stops() -> None:
    settings = {"preemption_checkpoints": True}
    victim = running(7, "a", (0,), started=0.0, limit=100 * HOUR)
    s = snap([node("a", 1)], [job(1, submitted=100.0, limit=HOUR)], [victim], settings=settings)
    s = replace(s, now=4 * HOUR)
    assert [p.job_id for p in get_policy("gittins").schedule(s).preempts] == [7]
    # Another long job now runs beside the stopping one: still no second victim for job 1.
    other = running(8, "a", (1,), started=0.0, limit=100 * HOUR)
    nodes = [_held(node("a", 2), 0)]
    s2 = snap(nodes, [job(1, submitted=100.0, limit=HOUR)], [other], settings=settings)
    s2 = replace(s2, now=4 * HOUR)
    assert [p.job_id for p in get_policy("gittins").schedule(s2).preempts] == [8]
    assert get_policy("gittins").schedule(_releasing(s2, j1=("a",))).preempts == ()


def test_jobs_still_stopping_count_against_the_cap_per_cycle() -> None:
    run = [
        running(1, "a", (0, 1), team="big", started=0),
        running(2, "b", (0, 1), team="big", started=0),
    ]
    pending = [job(10, 2, team="lab"), job(11, 2, team="lab", submitted=1.0)]
    nodes = [node("a", 2), node("b", 2)]
    s = snap(nodes, pending, run, teams=TEAMS, settings={"max_preemptions_per_cycle": 2})
    assert len(get_policy("priority").schedule(s).preempts) == 2
    one = get_policy("priority").schedule(replace(s, preemptions_stopping=1))
    assert [p.for_job for p in one.preempts] == [10]
    assert get_policy("priority").schedule(replace(s, preemptions_stopping=5)).preempts == ()
