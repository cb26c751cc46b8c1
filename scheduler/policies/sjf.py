"""Shortest (predicted) job first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.core.model import Plan, Snapshot
from scheduler.policies.base import cycle_may_preempt, run_ordered


class SjfPolicy:
    """Jobs with the shortest expected runtime (prediction, else time limit) go first;
    any job that fits starts.

    Trade-off: minimises mean waiting time when predictions are good, but long jobs can
    wait indefinitely while short ones keep arriving, and users who pad their time limits
    are pushed back (which predictions from history soften).
    """

    name = "sjf"
    blocking = False

    # For drivers that skip cycles (the simulator): decisions depend on the clock only
    # through preemption, and preemption needs `may_preempt`.
    time_dependent = False

    def may_preempt(self, settings: Mapping[str, Any], guarantees: bool) -> bool:
        return cycle_may_preempt(settings, guarantees)

    def __init__(self, **params: object) -> None:
        self.params = params

    def order(self, snapshot: Snapshot) -> list:
        return sorted(snapshot.pending, key=lambda j: (j.expected_runtime, j.submitted_at, j.id))

    def schedule(self, snapshot: Snapshot) -> Plan:
        preempt = bool(snapshot.settings.get("preemption", True))
        return run_ordered(snapshot, self.name, self.order(snapshot), preempt=preempt)
