"""Per-team decayed GPU usage in the simulator, the input of fair-share policies.

Exact for a constant number of GPUs between changes: u' = u d + r (h / ln 2)(1 - d) with
d = 2^(-dt/h), where r is the team's running GPUs and h the half-life (the settings key
"fairshare_half_life", default one day, as the production snapshot builder uses).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from scheduler.core.model import TeamState

LN2 = math.log(2)


class TeamUsage:
    def __init__(self, teams: Iterable[str], half_life: float, guaranteed: Mapping[str, int]):
        self.half_life = max(half_life, 1e-9)
        self.guaranteed = dict(guaranteed)
        self.usage = {t: 0.0 for t in teams}
        self.running = {t: 0.0 for t in self.usage}
        self.clock = {t: 0.0 for t in self.usage}

    def _accrue(self, team: str, now: float) -> None:
        dt = now - self.clock[team]
        if dt <= 0:
            return
        h = self.half_life
        decay = 2.0 ** (-dt / h)
        self.usage[team] = self.usage[team] * decay + self.running[team] * (h / LN2) * (1 - decay)
        self.clock[team] = now

    def change(self, team: str, delta_gpus: float, now: float) -> None:
        """The team's running GPUs change by `delta_gpus` at `now`."""
        self._accrue(team, now)
        self.running[team] += delta_gpus

    def states(self, now: float) -> Mapping[str, TeamState]:
        for team in self.usage:
            self._accrue(team, now)
        return MappingProxyType(
            {
                t: TeamState(slug=t, guaranteed_gpus=self.guaranteed.get(t, 0), decayed_usage=u)
                for t, u in self.usage.items()
            }
        )
