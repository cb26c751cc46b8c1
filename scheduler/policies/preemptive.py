"""What the preemptive policies (las, gittins, tiresias) share: the class flags drivers read
and the lookup of a parameter given to the policy, else in the snapshot's settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.core.model import Snapshot


class PreemptivePolicy:
    """A policy that orders by attained service and preempts on its own rule.

    `blocking` false: any job that fits starts. `time_dependent`: attained service grows
    with the clock, so for drivers that skip cycles (the simulator) a cycle without news may
    still decide differently, and any cycle may preempt (`may_preempt`).
    """

    name: str
    blocking = False
    time_dependent = True

    def __init__(self, **params: Any) -> None:
        self.params = params

    def may_preempt(self, settings: Mapping[str, Any], guarantees: bool) -> bool:
        return True

    @staticmethod
    def setting(snapshot: Snapshot, own: Any, key: str, default: Any) -> Any:
        """The policy's own parameter when given, else settings[key], else the default."""
        if own is not None:
            return own
        value = snapshot.settings.get(key)
        return default if value is None else value
