"""The preemptive Gittins policies tell the walk which waiting jobs their rule could allow
any victim (scheduler.policies.gittins_hint): never a job the rule allows one, and the walk
passes over the rest once they cannot start, with the same plan."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.core.model import Snapshot
from scheduler.policies import get_policy
from scheduler.policies.base import Cycle
from scheduler.policies.gittins_hint import may_allow_any
from tests.scheduler.core.builders import job, node, running, snap, team
from tests.scheduler.policies.strategies import snapshots

CHECKS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEAVY = tuple(60.0 * 10**k for k in range(5) for _ in range(4))
RATIOS = tuple(k / 20 for k in range(1, 21))


def _cycle_of(name: str, snapshot: Snapshot) -> Cycle:
    cycles: list[Cycle] = []
    original = Cycle.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        cycles.append(self)

    with mock.patch.object(Cycle, "__init__", spy):
        get_policy(name).schedule(snapshot)
    return cycles[-1]


@st.composite
def histories(draw: st.DrawFn) -> Snapshot:
    snapshot = draw(snapshots(max_nodes=4, max_pending=30))
    kind = draw(st.sampled_from(["none", "heavy", "ratios"]))
    if kind == "heavy":
        snapshot = replace(snapshot, service_distribution=HEAVY)
    elif kind == "ratios":
        snapshot = replace(snapshot, limit_ratio_distribution=RATIOS)
    extra = draw(st.sampled_from([{}, {"gittins_min_slice": 0}, {"preemption_gain_check": False}]))
    return replace(snapshot, settings=MappingProxyType({**snapshot.settings, **extra}))


@pytest.mark.parametrize("name", ["gittins", "gittins-tiers"])
@CHECKS
@given(snapshot=histories())
def test_a_job_passed_over_is_allowed_no_victim(name: str, snapshot: Snapshot) -> None:
    cycle = _cycle_of(name, snapshot)
    if cycle.victim_rule is None or cycle.rule_hint is None:
        return
    victims = [r for r in snapshot.running if r.preemptible and not cycle.costs.capped(r)]
    hint = cycle.rule_hint(snapshot.pending, victims)
    for pending, may in zip(snapshot.pending, hint.tolist(), strict=True):
        if not may:
            assert all(cycle.victim_rule(pending, v) is None for v in victims)


def _full_and_young(pending: int = 40) -> Snapshot:
    """Two nodes busy with jobs started 100 s ago (younger than the 300 s minimum slice,
    so no victim), one GPU free on node b; teams over their guarantees. Behind 4-GPU jobs
    that fit nowhere, one 1-GPU job at position 20 that fits."""
    nodes = [node("a", 8), node("b", 8)]
    busy = [
        running(1, "a", tuple(range(8)), team="x", started=9_900.0, limit=1e6),
        running(2, "b", tuple(range(7)), team="y", started=9_900.0, limit=1e6),
    ]
    jobs = [
        job(100 + k, 1 if k == 20 else 4, team="x" if k % 2 else "y", submitted=float(k), limit=1e5)
        for k in range(pending)
    ]
    teams = [team("x", guaranteed_gpus=2), team("y", guaranteed_gpus=2)]
    return replace(snap(nodes, jobs, busy, teams=teams, now=10_000.0), service_distribution=HEAVY)


@pytest.mark.parametrize("name", ["gittins", "gittins-tiers"])
def test_walk_passes_over_jobs_that_can_neither_start_nor_preempt(name: str) -> None:
    snapshot = _full_and_young()
    plain = replace(snapshot, settings=MappingProxyType({"fast_paths": False}))
    reference = get_policy(name).schedule(plain)
    considered: list[int] = []
    original = Cycle.consider

    def spy(self, pending):
        considered.append(pending.id)
        return original(self, pending)

    with mock.patch.object(Cycle, "consider", spy):
        fast = get_policy(name).schedule(snapshot)
    assert fast == reference
    assert [p.job_id for p in reference.places] == [120] and not reference.preempts
    assert considered == [100, 120]


def _columns(bound, other, cost, lost=(0.0, 0.0)) -> dict:
    return {
        "young": np.zeros(len(bound), bool),
        "bound": np.array(bound, float),
        "other": np.array(other, float),
        "cost": np.array(cost, float),
        "lost": np.array(lost, float),
    }


def test_one_victim_must_pass_the_index_and_the_gain_test_together() -> None:
    """Victim 1's index bound is below the job's index but it has little service left;
    victim 2 has much left but an index bound above the job's: the rule allows neither, so
    the job is passed over, though each test alone has a victim that passes it."""
    victims = [running(1, "a", (0,)), running(2, "a", (1,))]
    pending = [job(10, 1), job(11, 1)]
    mine = np.array([0.5, 2.0])
    columns = _columns(bound=[0.1, 1.0], other=[100.0, 10_000.0], cost=[0.0, 0.0])
    hint = may_allow_any(columns, victims, pending, mine, lambda rows: rows * 0 + 500.0, 0.0, None)
    # Job 10 (index 0.5) may take only victim 1, which has 100 left (< 500): none.
    # Job 11 (index 2.0) may take victim 2 as well, which has 10,000 left: kept.
    assert hint.tolist() == [False, True]


def test_a_victim_of_an_earlier_tier_does_not_keep_a_job() -> None:
    """The one victim that passes both tests goes in a tier before the job's."""
    victims = [running(1, "a", (0,)), running(2, "a", (1,))]
    pending = [job(10, 1), job(11, 1)]
    tiers = ({10: 1, 11: 0}, {1: 1, 2: 0})
    columns = _columns(bound=[0.1, 0.1], other=[100.0, 10_000.0], cost=[0.0, 0.0])
    mine = np.ones(len(pending))
    hint = may_allow_any(columns, victims, pending, mine, lambda rows: rows * 0 + 500.0, 0.0, tiers)
    # Job 10 (tier 1) may take only victim 1 (tier 1), with too little left; job 11
    # (tier 0) may take victim 2 too.
    assert hint.tolist() == [False, True]


@pytest.mark.parametrize("name", ["gittins", "gittins-tiers"])
@CHECKS
@given(snapshot=histories())
def test_the_walks_queue_gets_the_hint_from_columns_as_from_each_job(
    name: str, snapshot: Snapshot
) -> None:
    """For the queue it walks, the policy reads indices and remaining service from
    columns; the hint is the one asked job by job, and never drops a job the rule allows
    a victim."""
    walked: list[list] = []
    original = Cycle.consider_all

    def spy(self, jobs, rest=None):
        walked.append(jobs)
        return original(self, jobs, rest)

    with mock.patch.object(Cycle, "consider_all", spy):
        cycle = _cycle_of(name, snapshot)
    if cycle.victim_rule is None or cycle.rule_hint is None:
        return
    victims = [r for r in snapshot.running if r.preemptible and not cycle.costs.capped(r)]
    queue = walked[-1]
    hint = cycle.rule_hint(queue, victims)
    assert hint.tolist() == cycle.rule_hint(list(queue), victims).tolist()
    for pending, may in zip(queue, hint.tolist(), strict=True):
        if not may:
            assert all(cycle.victim_rule(pending, v) is None for v in victims)
