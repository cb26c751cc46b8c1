"""gittins-tiers keeps the running jobs' tiers across cycles by job object
(scheduler.policies.gittins_running); whatever it saw before, the tiers, the teams' use
and the plan must be those of a policy that saw nothing, to the bit."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.model import RunningChanges, Snapshot
from scheduler.policies import get_policy
from scheduler.policies.gittins_tiers import GittinsTiersPolicy, priority_points
from tests.scheduler.core.builders import job, node, running, snap, team
from tests.scheduler.policies.strategies import snapshots

HEAVY = tuple(60.0 * 10**k for k in range(5) for _ in range(4))


def _tiers(policy: GittinsTiersPolicy, snapshot: Snapshot) -> str:
    """The running jobs' tiers and the teams' use, as the policy gives them (repr tells
    apart the floats == does not, and the order of the entries)."""
    return repr(policy._running_tiers(snapshot, priority_points(snapshot)))


def _fresh_tiers(snapshot: Snapshot) -> str:
    plain = replace(snapshot, settings=MappingProxyType({**snapshot.settings, "fast_paths": False}))
    return _tiers(GittinsTiersPolicy(), plain)


def _cycle(policy: GittinsTiersPolicy, snapshot: Snapshot) -> Any:
    """The carried policy's plan, checked against a new policy's, and its tiers against
    the job-by-job ones."""
    plan = policy.schedule(snapshot)
    assert plan == get_policy("gittins-tiers").schedule(snapshot)
    assert _tiers(policy, snapshot) == _fresh_tiers(snapshot)
    return plan


def _snap(running_jobs, guarantee: int = 1, weight: float = 0.0, before=None, **kw) -> Snapshot:
    teams = [team("a", guaranteed_gpus=guarantee), team("b"), team("c")]
    settings = {"priority_weight_job": weight}
    base = snap(
        [node("n1", 2)],
        [job(1, team="b", limit=1e9)],
        running_jobs,
        teams=teams,
        settings=settings,
        now=10_000.0,
    )
    base = replace(base, service_distribution=HEAVY, **kw)
    if before is not None:
        base = replace(base, running_changes=before(base.running))
    return base


def test_a_runner_whose_team_drops_below_its_guarantee_is_no_longer_preempted() -> None:
    # Team a is guaranteed 1 GPU. Its first job by start holds it (and cannot be preempted),
    # so the long runner, started after it, borrows: team b's fresh job preempts it.
    first = running(7, "n1", (0,), team="a", started=8_000.0, preemptible=False)
    long_runner = running(
        9, "n1", (1,), team="a", started=9_000.0, limit=1e9, attained_service=72_000.0, priority=-1
    )
    policy = GittinsTiersPolicy()
    one = _snap((first, long_runner))
    assert [p.job_id for p in _cycle(policy, one).preempts] == [9]
    assert [p.job_id for p in _cycle(policy, one).preempts] == [9]  # kept from the last
    assert policy._running.reused >= 1
    # The first job ends and team c's takes its GPU: the long runner is now within team
    # a's guarantee, its tier goes before the waiting job's.
    other = running(20, "n1", (0,), team="c", started=10_000.0, preemptible=False)
    two = _snap(
        (long_runner, other), before=lambda now: RunningChanges(one.running, (other,), (first,))
    )
    assert _cycle(policy, two).preempts == ()
    # The same jobs, team a's guarantee gone: it borrows again.
    three = _snap(two.running, guarantee=0)
    assert [p.job_id for p in _cycle(policy, three).preempts] == [9]
    # The same jobs and guarantee, job priorities now weigh: the waiting job's tier
    # (priority 0) goes before the long runner's (-1) whatever the quota.
    assert _cycle(policy, _snap(two.running)).preempts == ()
    four = _snap(two.running, weight=1.0)
    assert [p.job_id for p in _cycle(policy, four).preempts] == [9]


def test_what_the_columns_cannot_hold_goes_job_by_job() -> None:
    # An int start, a NaN one (the plan would not have one: the tiers alone are compared),
    # an id twice: the rows do not choose, the job-by-job way answers.
    odd = (
        (running(1, "n1", (0,), team="a", started=5),),
        (running(2, "n1", (1,), team="a", started=float("nan")),),
        (running(3, "n1", (0,), team="a", started=1.0), running(3, "n1", (1,), team="b")),
    )
    policy = GittinsTiersPolicy()
    for kept in (*odd, odd[0]):
        s = _snap(kept)
        assert _tiers(policy, s) == _tiers(policy, s) == _fresh_tiers(s)
    assert policy._running.reused == policy._running.worked == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=snapshots(max_nodes=4, max_pending=8),
    stops=st.lists(st.lists(st.booleans(), min_size=12, max_size=12), min_size=4, max_size=4),
    guarantees=st.lists(st.integers(0, 6), min_size=3, max_size=3),
    teams=st.lists(st.sampled_from(["vision", "nlp", "speech", "new"]), min_size=12, max_size=12),
    told=st.booleans(),
    weights=st.sampled_from([(1.0, 1000.0), (0.0, 1000.0), (1.0, 0.0), (-0.0, 1000.0)]),
)
def test_tiers_across_cycles_are_the_job_by_job_ones(
    first: Snapshot,
    stops: list[list[bool]],
    guarantees: list[int],
    teams: list[str],
    told: bool,
    weights: tuple[float, float],
) -> None:
    policy = GittinsTiersPolicy()
    s = replace(first, service_distribution=HEAVY)
    _cycle(policy, s)
    next_id = 50_000
    for cycle, stop in enumerate(stops):
        # Some running jobs stop; a new job of some team takes the GPUs of every other one
        # stopped, started now. The others are the very objects of the last cycle.
        now = s.now + 60.0
        stopped = [r for r, off in zip(s.running, stop, strict=False) if off]
        started = []
        for k, r in enumerate(stopped[::2]):
            next_id += 1
            started.append(replace(r, id=next_id, team=teams[k], started_at=now))
        kept = tuple(r for r in s.running if r not in stopped)
        changes = RunningChanges(s.running, tuple(started), tuple(stopped)) if told else None
        s = replace(s, now=now, running=(*kept, *started), running_changes=changes)
        if cycle == 1:  # the guarantees move
            moved = {
                t: replace(v, guaranteed_gpus=g)
                for (t, v), g in zip(s.teams.items(), guarantees, strict=False)
            }
            s = replace(s, teams=MappingProxyType(moved))
        if cycle == 2:  # the points rule moves
            w_job, w_qos = weights
            extra = {"priority_weight_job": w_job, "priority_weight_qos": w_qos}
            s = replace(s, settings=MappingProxyType({**s.settings, **extra}))
        _cycle(policy, s)
        _cycle(policy, replace(s, running=tuple(list(s.running))))  # the same jobs, a new tuple
    assert policy._running.reused > 0


def test_new_objects_every_cycle_make_no_rows() -> None:
    # As production builds its snapshot: the job-by-job way, no row per job every cycle;
    # the same objects seen again make rows, then answer from them.
    jobs = (running(1, "n1", (0,), team="a", started=1.0), running(2, "n1", (1,), team="a"))
    policy = GittinsTiersPolicy()
    for _ in range(3):
        s = _snap(tuple(replace(r) for r in jobs))
        assert _tiers(policy, s) == _fresh_tiers(s)
    assert policy._running.worked == 0
    again = replace(s, running=tuple(list(s.running)))
    assert _tiers(policy, again) == _tiers(policy, again) == _fresh_tiers(again)
    assert (policy._running.worked, policy._running.reused) == (1, 1)
