"""First come, first served, strictly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.core.model import Plan, Snapshot
from scheduler.policies.base import cycle_may_preempt, run_ordered


class FcfsPolicy:
    """Jobs start in submit order; if the oldest job does not fit, nothing behind it starts.

    Trade-off: perfectly predictable and starvation-free (a job's position only improves),
    at the price of idle GPUs behind a large head job (head-of-line blocking). A head job
    of a team within its guarantee may still reclaim GPUs from borrowers.
    """

    name = "fcfs"
    blocking = True

    # For drivers that skip cycles (the simulator): decisions depend on the clock only
    # through preemption, and preemption needs `may_preempt`.
    time_dependent = False

    def may_preempt(self, settings: Mapping[str, Any], guarantees: bool) -> bool:
        return cycle_may_preempt(settings, guarantees)

    def __init__(self, **params: object) -> None:
        self.params = params

    def order(self, snapshot: Snapshot) -> list:
        return sorted(snapshot.pending, key=lambda j: (j.submitted_at, j.id))

    def schedule(self, snapshot: Snapshot) -> Plan:
        preempt = bool(snapshot.settings.get("preemption", True))
        return run_ordered(
            snapshot, self.name, self.order(snapshot), blocking=True, preempt=preempt
        )
