"""Victim rules give reasons written only when read: a search weighs every allowed victim
and preempts a few, so only the chosen ones' reasons are written out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from scheduler.core.preemption_cost import PreemptionCost
from scheduler.policies import get_policy
from scheduler.policies.cycle_preempt import Reason
from tests.scheduler.core.builders import job, node, running, snap

HEAVY = tuple(60.0 * 10**k for k in range(5) for _ in range(4))


def _fleet(now: float) -> Any:
    """Eight one-GPU nodes, each running a long job deep in the tail; one short job waits."""
    nodes = [node(f"n{k}", 1) for k in range(8)]
    runners = [
        running(
            10 + k, f"n{k}", (0,), started=now - 3_000.0 - k, limit=1e9, attained_service=72_000.0
        )
        for k in range(8)
    ]
    waiting = [job(1, limit=1e9, submitted=now - 100.0)]
    return replace(snap(nodes, waiting, runners, now=now), service_distribution=HEAVY)


@pytest.mark.parametrize("policy", ["gittins", "las"])
def test_only_the_chosen_victims_reasons_are_written(policy: str, monkeypatch) -> None:
    written: list[int] = []
    pays = PreemptionCost.pays

    def counted(self, waiting, victim_remaining, victim, now):  # type: ignore[no-untyped-def]
        written.append(victim.id)
        return pays(self, waiting, victim_remaining, victim, now)

    monkeypatch.setattr(PreemptionCost, "pays", counted)
    snapshot = _fleet(10_000.0)
    # With the fast paths off, the rule is asked about every preemptible job.
    snapshot = replace(snapshot, settings={"fast_paths": False})
    plan = get_policy(policy).schedule(snapshot)
    assert len(plan.preempts) == 1
    victim = plan.preempts[0]
    assert written == [victim.job_id]
    assert "which beats 8 x the preemption's cost" in victim.reason


def test_a_reason_is_written_each_time_it_is_read() -> None:
    calls: list[str] = []

    def write() -> str:
        calls.append("w")
        return "because"

    reason = Reason(write)
    assert calls == []
    assert f"preempted: {reason}" == "preempted: because"
    assert str(reason) == "because"
    assert calls == ["w", "w"]
