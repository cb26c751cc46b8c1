"""Fair share by dominant share."""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from scheduler.core.model import PendingJob, Plan, Snapshot
from scheduler.policies.base import Cycle, cycle_may_preempt


class FairsharePolicy:
    """The team furthest below its fair share goes next, re-ranked after every start.

    A team's standing is its dominant share over its weight share: the larger of its
    share of all decayed usage (`TeamState.decayed_usage`, GPU-seconds halving every
    settings "fairshare_half_life" seconds, default one day, applied by the snapshot
    builder; see scheduler.core.usage) and its share of the fleet's GPUs held now,
    divided by its fair-share weight over the sum of weights of teams with work. Fractions
    count by GPU equivalents. Within a team, higher job priority and then submit order go
    first; any job that fits starts.

    Trade-off: over hours teams converge to their weights whatever they submit, but a
    team that was idle can take most of the fleet for a while (its usage decayed away),
    and a single team's queue order is plain priority.
    """

    name = "fairshare"
    blocking = False

    # For drivers that skip cycles (the simulator): the order moves with the clock (age,
    # decayed usage), so a cycle without news may still decide differently.
    time_dependent = True

    def may_preempt(self, settings: Mapping[str, Any], guarantees: bool) -> bool:
        return cycle_may_preempt(settings, guarantees)

    def __init__(self, **params: object) -> None:
        self.params = params

    def schedule(self, snapshot: Snapshot) -> Plan:
        cycle = Cycle(snapshot, self.name, preempt=bool(snapshot.settings.get("preemption", True)))
        queues: dict[str, list[PendingJob]] = {}
        for job in sorted(snapshot.pending, key=lambda j: (-j.priority, j.submitted_at, j.id)):
            queues.setdefault(job.team, []).append(job)
        active = set(queues) | {r.team for r in snapshot.running}
        weights = {
            t: max(snapshot.teams[t].fairshare_weight if t in snapshot.teams else 1.0, 1e-9)
            for t in active
        }
        total_weight = sum(weights.values()) or 1.0
        usage = {t: snapshot.teams[t].decayed_usage if t in snapshot.teams else 0.0 for t in active}
        total_usage = sum(usage.values())
        total_gpus = sum(len(n.gpus) for n in snapshot.nodes) or 1

        def standing(team: str) -> float:
            used = usage[team] / total_usage if total_usage > 0 else 0.0
            held = cycle.quota.usage(team) / total_gpus
            return max(used, held) / (weights[team] / total_weight)

        heap = [(standing(t), t) for t in queues]
        heapq.heapify(heap)
        position = dict.fromkeys(queues, 0)
        while heap:
            _, team = heapq.heappop(heap)
            job = queues[team][position[team]]
            position[team] += 1
            cycle.consider(job)
            if position[team] < len(queues[team]):
                heapq.heappush(heap, (standing(team), team))
        return cycle.plan()
