"""las' victim rule by columns (scheduler.policies.las_columns): the filter lists exactly
the victims the rule's tests allow, the hint passes over only jobs the rule allows none,
and plans are those of the rule alone (settings "fast_paths" false)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.model import PendingJob, RunningJob, Snapshot
from scheduler.policies import get_policy
from scheduler.policies.las import LasPolicy, QueueVictims
from tests.scheduler.core.builders import job, node, running, snap
from tests.scheduler.invariants import assert_plan_valid
from tests.scheduler.policies.strategies import CYCLE_CHECKS, snapshots, with_settings

# Sizes in GPU-seconds, as a fleet's finished jobs would teach them.
ATOMS = (600.0, 3_600.0, 7_200.0, 36_000.0, 90_000.0, 400_000.0, 2_000_000.0)


def _full_fleet(seed: int, **settings: Any) -> Snapshot:
    """Eight full nodes of preemptible jobs of every age and a queue of small and large
    jobs, some of them requeued with service attained."""
    rng = random.Random(seed)
    nodes = [node(f"n{i}", 8) for i in range(8)]
    runs, next_id = [], 100
    for n in nodes:
        g = 0
        while g < 8:
            size = min(rng.choice((1, 1, 2, 4)), 8 - g)
            runs.append(
                running(
                    next_id,
                    n.name,
                    tuple(range(g, g + size)),
                    started=rng.uniform(0, 9_900),
                    limit=1e6,
                    attained_service=rng.choice((0.0, 600.0, 20_000.0, 200_000.0, 900_000.0)),
                    preemptible=rng.random() < 0.9,
                )
            )
            next_id += 1
            g += size
    pending = [
        job(
            i,
            rng.choice((1, 1, 2, 8)),
            submitted=rng.uniform(0, 9_000),
            limit=1e6,
            attained_service=rng.choice((0.0, 0.0, 3_000.0, 50_000.0)),
        )
        for i in range(1, 61)
    ]
    base = snap(nodes, pending, runs, settings=settings, now=10_000.0)
    return replace(base, service_distribution=ATOMS)


def _rule_allows(victims: QueueVictims, job: PendingJob, running: list[RunningJob]) -> list[int]:
    return [k for k, v in enumerate(running) if victims.rule(job, v) is not None]


@pytest.mark.parametrize("gain_check", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_filter_lists_exactly_what_the_rule_allows(seed: int, gain_check: bool) -> None:
    snapshot = _full_fleet(seed, preemption_gain_check=gain_check)
    victims = LasPolicy().queue_victims(snapshot)
    found = victims.filter()
    hint = victims.hint()
    assert found is not None and hint is not None
    running_jobs = list(snapshot.running)
    pending = list(snapshot.pending)
    hinted = hint(pending, running_jobs)
    allowed_any = 0
    for k, waiting in enumerate(pending):
        allowed = _rule_allows(victims, waiting, running_jobs)
        assert list(found(waiting, running_jobs)) == allowed
        if allowed:
            allowed_any += 1
            assert hinted[k]
    assert allowed_any, "the case must have jobs the rule allows victims"


@pytest.mark.parametrize("name", ["las", "gavel"])
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("checkpoints", [False, True])
def test_plans_are_those_of_the_rule_alone(name: str, seed: int, checkpoints: bool) -> None:
    snapshot = _full_fleet(seed, preemption_checkpoints=checkpoints)
    fast = get_policy(name).schedule(snapshot)
    plain = get_policy(name).schedule(with_settings(snapshot, fast_paths=False))
    assert fast == plain
    assert_plan_valid(snapshot, fast)
    if checkpoints:
        assert fast.preempts, "the case must exercise preemption"


@pytest.mark.parametrize("name", ["las", "gavel"])
@CYCLE_CHECKS
@given(snapshot=snapshots(), atoms=st.lists(st.floats(1.0, 1e7), max_size=12))
def test_random_plans_are_those_of_the_rule_alone(
    name: str, snapshot: Snapshot, atoms: list[float]
) -> None:
    s = replace(snapshot, service_distribution=tuple(sorted(atoms)))
    assert get_policy(name).schedule(s) == get_policy(name).schedule(
        with_settings(s, fast_paths=False)
    )


def test_a_fleet_where_no_preemption_pays_asks_the_rule_nothing() -> None:
    """Every running job young and small against jobs that need much more: no victim pays,
    and the rule is asked about none (it was asked about every pair of a waiting job that
    did not fit and a running job)."""
    base = _full_fleet(1)
    young = tuple(replace(r, attained_service=0.0, started_at=9_990.0) for r in base.running)
    snapshot = replace(base, running=young)
    asked: list[int] = []
    make = LasPolicy.queue_victims

    def counted(self: LasPolicy, s: Snapshot) -> QueueVictims:
        victims = make(self, s)

        def rule(waiting: PendingJob, victim: RunningJob) -> Any:
            asked.append(victim.id)
            return victims.rule(waiting, victim)

        return replace(victims, rule=rule)

    hint = LasPolicy().queue_victims(snapshot).hint()
    assert hint is not None
    assert not hint(list(snapshot.pending), list(snapshot.running)).any()
    with patch.object(LasPolicy, "queue_victims", counted):
        plan = get_policy("las").schedule(snapshot)
    assert plan.preempts == ()
    assert asked == []
    assert plan == get_policy("las").schedule(with_settings(snapshot, fast_paths=False))
