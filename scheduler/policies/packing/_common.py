"""Plan assembly shared by the packing policies."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.core.explain import why_waiting
from scheduler.core.model import PendingJob, Place, Plan, Snapshot, Wait
from scheduler.core.placement import FreeCapacity
from scheduler.core.quota import QuotaLedger


def finish_plan(
    name: str,
    snapshot: Snapshot,
    cap: FreeCapacity,
    ledger: QuotaLedger,
    places: Sequence[Place],
    order: Sequence[PendingJob],
    notes: Sequence[str] = (),
) -> Plan:
    """The plan: places, a Wait (why, from what is left after the places) for every other
    pending job, and the queue order."""
    placed = {p.job_id for p in places}
    waits = tuple(
        Wait(job.id, why_waiting(job, cap, snapshot, ledger))
        for job in order
        if job.id not in placed
    )
    return Plan(
        policy=name,
        places=tuple(places),
        waits=waits,
        order=tuple(job.id for job in order),
        notes=tuple(notes),
    )
