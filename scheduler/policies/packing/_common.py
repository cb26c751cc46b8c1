"""Plan assembly shared by the packing policies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.core.admission import admission_error
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
    reasons: dict[tuple[Any, ...], str] = {}
    waits = []
    for job in order:
        if job.id in placed:
            continue
        key = (job.gpus, job.gpu_model, job.min_gpu_memory_mb, job.gpu_memory_mb,
               job.gpu_compute_percent, job.gpus_per_node, job.cpus, job.memory_mb,
               job.same_group, job.team, job.user)  # fmt: skip
        text = reasons.get(key)
        if text is None:
            never = admission_error(job, snapshot.nodes, snapshot.teams.get(job.team))
            if never is not None:
                text = f"can never start: {never}"
            else:
                text = why_waiting(job, cap, snapshot, ledger)
            reasons[key] = text
        waits.append(Wait(job.id, text))
    return Plan(
        policy=name,
        places=tuple(places),
        waits=tuple(waits),
        order=tuple(job.id for job in order),
        notes=tuple(notes),
    )
