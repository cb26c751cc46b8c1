"""The Gittins policies' inputs kept across cycles give the plain plan.

`gittins` and `gittins-tiers` keep each queued job's index, tier and needs as columns by
job object (scheduler.policies.gittins_rows); whatever they saw before, the plan must be
the one of the plain path (settings "fast_paths" false) on the same snapshot. The numbers
they work out by columns (scheduler.policies.gittins_columns) must be the job-by-job ones
to the bit.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scheduler.core.model import PendingChanges, PendingJob, Snapshot, TeamState
from scheduler.core.service_distribution import ServiceDistribution
from scheduler.policies import get_policy
from scheduler.policies.gittins import GittinsPolicy
from scheduler.policies.gittins_columns import IndexModel, quota_within
from scheduler.policies.gittins_hint import may_allow_any
from scheduler.policies.gittins_tiers import _quota_tiers
from tests.scheduler.core.builders import job, running
from tests.scheduler.policies.strategies import snapshots

CHECKS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = ["gittins", "gittins-tiers"]
HEAVY = tuple(60.0 * 10**k for k in range(5) for _ in range(4))
LIGHT = tuple(30.0 * 2**k for k in range(20))
RATIOS = tuple(k / 20 for k in range(1, 21))
FEW_RATIOS = (0.1, 0.5, 1.0) * 7


def _plain(name: str, snapshot: Snapshot) -> Any:
    settings = MappingProxyType({**snapshot.settings, "fast_paths": False})
    return get_policy(name).schedule(replace(snapshot, settings=settings))


def _check(policy: GittinsPolicy, snapshot: Snapshot) -> None:
    """The plan is the one of a policy that saw nothing before, and decides what the
    plain path decides (the same plan, unless "plan_waits" is off: then the order walked
    stops where the walk settled)."""
    plan = policy.schedule(snapshot)
    assert plan == get_policy(policy.name).schedule(snapshot)
    plain = _plain(policy.name, snapshot)
    if snapshot.settings.get("plan_waits", True):
        assert plan == plain
    else:
        assert (plan.places, plan.preempts, plan.reserves) == (
            plain.places,
            plain.preempts,
            plain.reserves,
        )


def _history(snapshot: Snapshot, kind: str) -> Snapshot:
    if kind == "heavy":
        return replace(snapshot, service_distribution=HEAVY, limit_ratio_distribution=())
    if kind == "light":
        return replace(snapshot, service_distribution=LIGHT, limit_ratio_distribution=())
    if kind == "ratios":
        return replace(snapshot, limit_ratio_distribution=RATIOS)
    if kind == "few ratios":
        return replace(snapshot, limit_ratio_distribution=FEW_RATIOS)
    return replace(snapshot, service_distribution=(), limit_ratio_distribution=())


KINDS = st.sampled_from(["none", "heavy", "light", "ratios", "few ratios"])


@pytest.mark.parametrize("name", NAMES)
@CHECKS
@given(
    first=snapshots(max_nodes=3, max_pending=24),
    keep=st.lists(st.booleans(), min_size=24, max_size=24),
    kinds=st.tuples(KINDS, KINDS),
    guarantees=st.lists(st.integers(0, 12), min_size=3, max_size=3),
    told=st.booleans(),
    extra=st.sampled_from(
        [{}, {"explain": False, "plan_waits": False}, {"gittins_use_limits": False}]
    ),
)
def test_plans_across_cycles_are_the_plain_plans(
    name: str,
    first: Snapshot,
    keep: list[bool],
    kinds: tuple[str, str],
    guarantees: list[int],
    told: bool,
    extra: dict,
) -> None:
    first = _history(first, kinds[0])
    first = replace(first, settings=MappingProxyType({**first.settings, **extra}))
    policy = get_policy(name)
    assert isinstance(policy, GittinsPolicy)
    _check(policy, first)
    _check(policy, first)  # the rows are built
    rows = policy._rows
    assert rows.builds == (1 if first.pending else 0)
    used = rows.changes_used
    # Next cycle: some jobs started, new ones queued (one with a new team and QoS, one
    # submitted before the others), guarantees, the clock and the history moved.
    kept = [j for i, j in enumerate(first.pending) if keep[i]]
    gone = [j for i, j in enumerate(first.pending) if not keep[i]]
    new = [
        PendingJob(99_997, "newteam", "ada", first.now - 5.0, 600.0, qos="urgent"),
        PendingJob(99_998, "vision", "bob", 0.0, 3600.0, gpus=2, attained_service=7000.0),
        PendingJob(99_999, "nlp", "cy", first.now, 60.0, gpus=0, gpu_compute_percent=30),
    ]
    teams = {
        t: replace(s, guaranteed_gpus=g)
        for (t, s), g in zip(first.teams.items(), guarantees, strict=False)
    }
    second = replace(
        _history(first, kinds[1]),
        pending=(*kept, *new),
        now=first.now + 60.0,
        teams=MappingProxyType(teams),
    )
    if told:
        second = replace(
            second, pending_changes=PendingChanges(first.pending, tuple(new), tuple(gone))
        )
    _check(policy, second)
    assert rows.changes_used == used + told
    # Two cycles on: the jobs kept start, the new ones stay.
    third = replace(second, pending=tuple(new), now=second.now + 60.0)
    third = replace(third, pending_changes=PendingChanges(second.pending, (), tuple(kept)))
    _check(policy, third)


@pytest.mark.parametrize("name", NAMES)
@CHECKS
@given(first=snapshots(max_nodes=3, max_pending=12), kind=KINDS)
def test_changes_that_do_not_match_the_rows_are_not_used(
    name: str, first: Snapshot, kind: str
) -> None:
    assume(first.pending)
    first = _history(first, kind)
    policy = get_policy(name)
    assert isinstance(policy, GittinsPolicy)
    _check(policy, first)
    _check(policy, first)
    used = policy._rows.changes_used
    new = PendingJob(99_999, "vision", "bob", first.now, 60.0, gpus=2)
    second = replace(first, pending=(*first.pending, new))

    def changed(added: list, removed: list) -> Snapshot:
        return replace(
            second, pending_changes=PendingChanges(first.pending, tuple(added), tuple(removed))
        )

    wrong = [
        changed([new], list(first.pending[:1])),
        changed([new], [replace(j) for j in first.pending[:1]]),
        replace(second, pending_changes=PendingChanges((), (new,), ())),
    ]
    for snapshot in wrong:
        _check(policy, snapshot)
        _check(policy, first)
    _check(policy, changed([new], []))
    assert policy._rows.changes_used == used + 1


@pytest.mark.parametrize("name", NAMES)
def test_a_queue_the_rows_cannot_sort_goes_the_plain_way(name: str) -> None:
    """A job twice, two jobs with one id (gittins-tiers has no plain answer for either),
    a submit time that is not a number."""
    jobs = tuple(job(i, 1, submitted=float(i)) for i in range(1, 5))
    snapshot = Snapshot(now=100.0, nodes=(), pending=jobs)
    policy = get_policy(name)
    assert isinstance(policy, GittinsPolicy)
    _check(policy, snapshot)
    _check(policy, snapshot)
    twice = [(*jobs, jobs[0]), (*jobs, replace(jobs[0], priority=3))] if name == "gittins" else []
    for pending in (*twice, (*jobs, job(9, 1, submitted=math.inf)), jobs):
        _check(policy, replace(snapshot, pending=pending))


def test_the_order_of_many_cycles_is_the_plain_order() -> None:
    """Cycle after cycle over carried objects, jobs of every tier arriving and starting,
    the history changing now and then: every plan is the plain one."""
    rng = np.random.default_rng(3)
    policy = get_policy("gittins-tiers")
    assert isinstance(policy, GittinsPolicy)
    teams = {t: TeamState(t, guaranteed_gpus=g) for t, g in (("a", 3), ("b", 0), ("c", 40))}
    queue: tuple[PendingJob, ...] = ()
    before = None
    next_id = 1
    for cycle in range(30):
        gone = tuple(j for j in queue if rng.random() < 0.2)
        new = []
        for _ in range(int(rng.integers(0, 8))):
            new.append(
                PendingJob(
                    next_id,
                    str(rng.choice(["a", "b", "c"])),
                    "u",
                    float(rng.integers(0, 1000)),
                    float(rng.choice([60.0, 600.0, 3600.0])),
                    gpus=int(rng.choice([0, 1, 2])),
                    gpu_compute_percent=int(rng.choice([10, 50])),
                    priority=int(rng.integers(0, 3)),
                    qos=str(rng.choice(["low", "normal", "high"])),
                    attained_service=float(rng.choice([0.0, 100.0, 5000.0])),
                )
            )
            next_id += 1
        queue = (*(j for j in queue if j not in gone), *new)
        changes = PendingChanges(before, tuple(new), gone) if before is not None else None
        before = queue
        snapshot = Snapshot(
            now=2000.0 + 60 * cycle,
            nodes=(),
            pending=queue,
            teams=MappingProxyType(teams),
            limit_ratio_distribution=RATIOS if cycle % 7 < 4 else FEW_RATIOS,
            pending_changes=changes,
        )
        _check(policy, snapshot)
    assert policy._rows.changes_used >= 25


AMOUNTS = st.sampled_from([0.0, 0.1, 0.25, 0.3, 0.5, 1.0, 2.0, 4.0, 8.0])


@CHECKS
@given(
    data=st.data(),
    n=st.integers(0, 120),
    guarantees=st.lists(st.integers(-1, 12), min_size=3, max_size=3),
    usage=st.lists(st.sampled_from([0.0, 0.3, 1.0, 2.5, 11.9]), min_size=3, max_size=3),
)
def test_quota_tiers_by_columns_are_the_job_by_job_ones(
    data: st.DataObject, n: int, guarantees: list[int], usage: list[float]
) -> None:
    teams = ("a", "b", "c", "none")
    codes = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    amounts = data.draw(st.lists(AMOUNTS, min_size=n, max_size=n))
    jobs = [
        job(k + 1, int(a), team=teams[c], gpu_compute_percent=round(a * 100))
        for k, (c, a) in enumerate(zip(codes, amounts, strict=True))
    ]
    states = {t: TeamState(t, guaranteed_gpus=g) for t, g in zip(teams, guarantees, strict=False)}
    start = dict(zip(teams, usage, strict=False))
    snapshot = Snapshot(now=0.0, nodes=(), teams=MappingProxyType(states))
    want = _quota_tiers(snapshot, jobs, start)
    got = quota_within(
        np.array(codes, np.int64),
        np.array([j.gpu_equivalent for j in jobs]),
        teams,
        start,
        {t: s.guaranteed_gpus for t, s in states.items()},
    )
    assert [want[j.id] == 0 for j in jobs] == got.tolist()


def test_quota_tiers_of_a_long_alternating_queue() -> None:
    """Big and small jobs in turn near the guarantee: the scan restarts after every big
    job, past its limit of restarts, and goes on job by job."""
    amounts = [0.25, 8.0] * 200
    jobs = [
        job(k + 1, 8, team="a") if a == 8.0 else job(k + 1, 0, team="a", gpu_compute_percent=25)
        for k, a in enumerate(amounts)
    ]
    snapshot = Snapshot(
        now=0.0, nodes=(), teams=MappingProxyType({"a": TeamState("a", guaranteed_gpus=30)})
    )
    want = _quota_tiers(snapshot, jobs, {"a": 1.0})
    got = quota_within(np.zeros(400, np.int64), np.array(amounts), ("a",), {"a": 1.0}, {"a": 30})
    assert [want[j.id] == 0 for j in jobs] == got.tolist()
    assert 20 < sum(got.tolist()) < 400


FLOATS = st.sampled_from([0.0, 1.0, 59.0, 60.0, 61.5, 3600.0, 7200.0, 1e5, 3.3e6, math.inf])


@CHECKS
@given(
    rows=st.lists(
        st.tuples(FLOATS, st.sampled_from([0.0, 60.0, 3600.0, 1e7]), AMOUNTS), max_size=40
    ),
    dist=st.sampled_from([None, HEAVY, LIGHT]),
    ratios=st.sampled_from([None, RATIOS, FEW_RATIOS]),
    use_limits=st.booleans(),
)
def test_indices_and_remaining_by_columns_are_the_job_by_job_ones(
    rows: list[tuple[float, float, float]],
    dist: tuple[float, ...] | None,
    ratios: tuple[float, ...] | None,
    use_limits: bool,
) -> None:
    model = IndexModel(
        ServiceDistribution(dist) if dist else None,
        ServiceDistribution(ratios) if ratios else None,
        use_limits,
    )

    def scalar(a: float, limit: float, gpus: float) -> float | None:
        try:
            return model.index(a, limit, gpus)
        except (ValueError, OverflowError):  # (math.floor of an infinity)
            return None

    # An attained service of infinity goes by ratios only (the bucket has no floor).
    rows = [r for r in rows if scalar(*r) is not None]
    attained, limits, gpus = (np.array([r[k] for r in rows], float) for k in range(3))
    got = model.indices(attained, limits, gpus)
    want = [model.index(*r) for r in rows]
    assert got.tolist() == want
    got = model.remainings(attained, limits * gpus)
    want = [model.remaining(*r) for r in rows]
    assert np.array_equal(got, np.array(want, float), equal_nan=True)


@CHECKS
@given(data=st.data(), n=st.integers(1, 30), m=st.integers(1, 12))
def test_the_hint_from_tier_columns_is_the_hint_from_each_job(
    data: st.DataObject, n: int, m: int
) -> None:
    levels = st.sampled_from([-2000.0, -1000.0, -3.0, -0.0, 0.0])
    jobs = [job(k + 1, 1) for k in range(n)]
    victims = [running(100 + k, "a", (0,)) for k in range(m)]
    points = data.draw(st.lists(levels, min_size=n, max_size=n))
    quota = data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    of_victims = data.draw(st.lists(st.tuples(levels, st.integers(0, 1)), min_size=m, max_size=m))
    tiers = (
        {j.id: (p, q) for j, p, q in zip(jobs, points, quota, strict=True)},
        {v.id: t for v, t in zip(victims, of_victims, strict=True)},
    )
    values = st.sampled_from([0.1, 0.5, 1.0, 2.0, 100.0, 5000.0])
    columns = {
        "young": np.array(data.draw(st.lists(st.booleans(), min_size=m, max_size=m))),
        "bound": np.array(data.draw(st.lists(values, min_size=m, max_size=m))),
        "other": np.array(data.draw(st.lists(values, min_size=m, max_size=m))),
        "cost": np.array(data.draw(st.lists(values, min_size=m, max_size=m))),
        "lost": np.array(data.draw(st.lists(values, min_size=m, max_size=m))),
    }
    mine = np.array(data.draw(st.lists(values, min_size=n, max_size=n)))
    left = data.draw(st.sampled_from([None, 1.0, 300.0]))
    left_of = None if left is None else (lambda rows: rows * 0 + left)
    each = may_allow_any(columns, victims, jobs, mine, left_of, 16.0, tiers)
    by_columns = may_allow_any(
        columns,
        victims,
        jobs,
        mine,
        left_of,
        16.0,
        tiers,
        (np.array(points), np.array(quota, np.int64)),
    )
    assert by_columns.tolist() == each.tolist()
