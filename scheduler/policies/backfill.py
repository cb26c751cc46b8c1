"""EASY backfill."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.core.model import PendingJob, Plan, Snapshot
from scheduler.policies.base import Cycle, cycle_may_preempt
from scheduler.policies.priority import priority_order, priority_ranked


class BackfillPolicy:
    """EASY backfill: jobs go in priority order (settings "backfill_order": "priority",
    the default, or "submit"); the first job that does not fit gets a reservation, the
    node and time at which enough GPUs free up as running jobs reach their time limits
    (or their predicted ends with settings "backfill_use_predictions"). A later job starts
    only if it fits now and either ends (by its time limit) before the reservation or
    stays off the reserved GPUs, so the reservation is never delayed.

    Trade-off: keeps GPUs busy without starving the head job, but only the head is
    protected (jobs behind it can be overtaken repeatedly), and it depends on time limits:
    padded limits make backfill timid; predicted ends make reservations a guess.
    """

    name = "backfill"
    blocking = False

    # For drivers that skip cycles (the simulator): the order moves with the clock (age,
    # decayed usage), so a cycle without news may still decide differently.
    time_dependent = True

    def may_preempt(self, settings: Mapping[str, Any], guarantees: bool) -> bool:
        return cycle_may_preempt(settings, guarantees)

    def __init__(self, **params: object) -> None:
        self.params = params

    def order(self, snapshot: Snapshot) -> list[PendingJob]:
        if snapshot.settings.get("backfill_order", "priority") == "submit":
            return sorted(snapshot.pending, key=lambda j: (j.submitted_at, j.id))
        return priority_order(snapshot)

    def schedule(self, snapshot: Snapshot) -> Plan:
        s = snapshot.settings
        cycle = Cycle(
            snapshot,
            self.name,
            reserve=True,
            reserve_with_predictions=bool(s.get("backfill_use_predictions", False)),
            preempt=bool(s.get("preemption", True)),
        )
        if snapshot.settings.get("backfill_order", "priority") == "submit":
            cycle.consider_all(self.order(snapshot))
        else:
            cycle.consider_all(*priority_ranked(snapshot))
        return cycle.plan()
