"""What holds GPU capacity until when (`scheduler.core.model.Occupant`): running jobs and
this cycle's placements, as the reservation search reads them."""

from __future__ import annotations

from typing import Any

from scheduler.core.model import Occupant, RunningJob
from scheduler.core.placement import Members


def occupant_of(job: Any, node: str, gpu_indices: tuple[int, ...], end: float) -> Occupant:
    return Occupant(
        end,
        node,
        gpu_indices,
        job.gpus,
        job.gpu_memory_mb,
        job.gpu_compute_percent,
        job.cpus,
        job.memory_mb,
    )


def occupants_of(job: Any, members: Members, end: float) -> list[Occupant]:
    """One occupant per member of a placement."""
    return [occupant_of(job, m.node, m.gpu_indices, end) for m in members]


def placements(job: RunningJob) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(node, GPU indices) of each member of a running job, rank 0 first: its allocations,
    without making a Member for a job of one node (the most of them)."""
    if not job.members:
        return ((job.node, job.gpu_indices),)
    return tuple((m.node, m.gpu_indices) for m in job.allocations)


# Occupant of each running job seen lately, by (id of the frozen RunningJob, predictions):
# drivers that keep RunningJob objects across cycles (the simulator) reuse them.
_OCCUPANTS: dict[tuple[int, bool], tuple[RunningJob, list[Occupant]]] = {}
_OCCUPANTS_MAX = 1 << 16
# The last list asked for, by predictions: (its running jobs, held, and their occupants),
# for the searches of one cycle.
_LAST: dict[bool, tuple[tuple[RunningJob, ...], list[Occupant]]] = {}


def running_occupants(running: tuple[RunningJob, ...], *, use_predictions: bool) -> list[Occupant]:
    last = _LAST.get(use_predictions)
    if last is not None and last[0] is running:
        return list(last[1])
    if len(_OCCUPANTS) >= _OCCUPANTS_MAX:
        _OCCUPANTS.clear()
    out: list[Occupant] = []
    get = _OCCUPANTS.get
    for r in running:
        key = (id(r), use_predictions)
        hit = get(key)
        if hit is None or hit[0] is not r:
            end = r.expected_end if use_predictions else r.limit_end
            if r.members:
                occupants = occupants_of(r, r.allocations, end)
            else:  # one member: its allocations without making them
                occupants = [occupant_of(r, r.node, r.gpu_indices, end)]
            hit = _OCCUPANTS[key] = (r, occupants)
        out.extend(hit[1])
    _LAST[use_predictions] = (running, out)
    return list(out)
