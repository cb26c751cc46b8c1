"""`greedy`: best-fit packing in priority, then size-descending order.

Jobs are taken by priority and, within a priority, largest first (first-fit-decreasing).
Each goes to its best fit (FreeCapacity.best_fit): a gang to the node with the fewest
wholly free GPUs that still holds it, a fraction to the fullest partly used GPU that still
has the memory and compute it asks for; so whole GPUs and whole nodes stay free for
large jobs. Quotas (team hard limit, per-user cap) are checked before placing.
"""

from __future__ import annotations

from typing import Any

from scheduler.core.model import Plan, Snapshot
from scheduler.core.placement import FreeCapacity
from scheduler.core.quota import QuotaLedger
from scheduler.policies.packing._common import finish_plan
from scheduler.policies.packing._decode import place_in_order
from scheduler.policies.packing._values import greedy_order


class GreedyPolicy:
    name = "greedy"

    def __init__(self, **params: Any) -> None:
        self.params = params

    def schedule(self, snapshot: Snapshot) -> Plan:
        cap = FreeCapacity.from_snapshot(snapshot)
        ledger = QuotaLedger.from_snapshot(snapshot)
        order = greedy_order(snapshot.pending)
        places = place_in_order(order, cap, ledger)
        return finish_plan(self.name, snapshot, cap, ledger, places, order)
