"""The advisor's candidates: every registered policy with its defaults, plus a handful of
settings of its main weights (pure: no Django).

Overrides are applied over the fleet's current parameters, so "priority, defaults" means the
priority policy with the parameters the fleet has now. Keys a deployment does not know
(scheduler.cycle.config.known_params) are left out, so every candidate can be applied.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MAX_CANDIDATES = 40

# A few settings per policy of the weights its decisions hang on; {} is the policy as set now.
GRID: dict[str, list[dict[str, Any]]] = {
    "fcfs": [{}, {"preemption": False}],
    "priority": [
        {},
        {"priority_weight_age": 10000.0},
        {"priority_weight_fairshare": 10000.0},
        {"priority_weight_size": 1000.0, "priority_favor_small": True},
        {"priority_weight_age": 0.0, "priority_weight_fairshare": 0.0},
    ],
    "sjf": [{}, {"preemption": False}],
    "fairshare": [{}, {"fairshare_half_life": 3600.0}, {"fairshare_half_life": 604800.0}],
    "backfill": [{}, {"backfill_use_predictions": True}, {"backfill_order": "submit"}],
    "las": [{}, {"las_preemption": False}],
    "gittins": [{}],
    "greedy": [{}, {"value_priority_weight": 1.0}, {"value_age_weight": 0.1}],
    # The search policies are slow on long traces: their defaults only.
    "ilp": [{}],
    "genetic": [{}],
    "annealing": [{}],
}


@dataclass(frozen=True)
class Candidate:
    policy: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.params:
            return f"{self.policy} (current weights)"
        shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(self.params.items()))
        return f"{self.policy} ({shown})"

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "params": dict(self.params), "label": self.label}


def candidates(
    policies: Iterable[str], known: Iterable[str], *, cap: int = MAX_CANDIDATES
) -> list[Candidate]:
    """Each policy's defaults first (so that every policy is in even when capped), then its
    variants round by round, at most `cap` in all."""
    known_keys = set(known)
    per_policy: list[list[Candidate]] = []
    for name in policies:
        seen: list[dict[str, Any]] = []
        for params in GRID.get(name, [{}]):
            if set(params) - known_keys or params in seen:
                continue
            seen.append(params)
        per_policy.append([Candidate(name, dict(p)) for p in seen] or [Candidate(name)])
    chosen: list[tuple[int, int]] = []
    depth = max((len(c) for c in per_policy), default=0)
    for i in range(depth):
        for p, cands in enumerate(per_policy):
            if i < len(cands) and len(chosen) < cap:
                chosen.append((p, i))
    return [per_policy[p][i] for p, i in sorted(chosen)]
