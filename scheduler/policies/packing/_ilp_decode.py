"""Concrete GPUs for the ILP's choice (`_ilp_model`): the class counts it solved for turned
into nodes and GPU indices."""

from __future__ import annotations

import numpy as np

from scheduler.core.model import PendingJob
from scheduler.policies.packing._ilp_classes import OPEN, GpuClass, Kind, SlotClass
from scheduler.policies.packing._ilp_highs import IlpResult


def decode_gangs(
    result: IlpResult,
    x: np.ndarray,
    chosen: set[int],
    sclasses: list[SlotClass],
    pat_cols: list[list[tuple[int, tuple[int, ...]]]],
    gang_classes: dict[tuple[int, str, int], list[PendingJob]],
    x_cols: dict[tuple[int, str, int], list[tuple[int, int]]],
) -> dict[Kind, list[tuple[str, int]]]:
    """Concrete GPUs for the gangs: the class's nodes in name order take the chosen
    patterns in their order; a gang takes the lowest GPUs of its part. Returns the GPUs
    opened to fractions, per kind."""
    parts: dict[tuple[int, int], list[tuple[str, tuple[int, ...]]]] = {}
    opened: dict[Kind, list[tuple[str, int]]] = {}
    for k, sc in enumerate(sclasses):
        slots = iter(sc.slots)
        for col, pat in pat_cols[k]:
            for _ in range(int(x[col])):
                slot = next(slots)
                pos = 0
                for s in pat:
                    width = max(s, 1)
                    indices = slot.indices[pos : pos + width]
                    pos += width
                    if s == OPEN:
                        opened.setdefault(sc.kind, []).append((slot.node, indices[0]))
                    else:
                        parts.setdefault((k, s), []).append((slot.node, indices))
    for key in sorted(gang_classes):
        queue = [j.id for j in gang_classes[key] if j.id in chosen]
        for k, col in x_cols.get(key, []):
            free = parts.get((k, key[0]), [])
            for _ in range(int(x[col])):
                if queue and free:
                    result.gangs[queue.pop(0)] = free.pop(0)
        result.unmapped += queue
    return opened


def decode_fractions(
    result: IlpResult,
    x: np.ndarray,
    chosen: set[int],
    gclasses: list[GpuClass],
    opened: dict[Kind, list[tuple[str, int]]],
    frac_classes: dict[tuple[int, int, str, int], list[PendingJob]],
    y_cols: dict[tuple[int, int, str, int], list[tuple[int, int]]],
) -> None:
    """Concrete GPUs for the fractions: per GPU class, first fit decreasing over its GPUs
    (name and index order); a fraction that fits none is left to best fit."""
    items: dict[int, list[PendingJob]] = {}
    for key in sorted(frac_classes):
        queue = [j for j in frac_classes[key] if j.id in chosen]
        for g, col in y_cols.get(key, []):
            for _ in range(int(x[col])):
                if queue:
                    items.setdefault(g, []).append(queue.pop(0))
        result.unmapped += [j.id for j in queue]
    for g, jobs in sorted(items.items()):
        gc = gclasses[g]
        gpus = opened.get(gc.kind, []) if gc.opened else gc.gpus
        room = [[gc.free_memory_mb, gc.free_compute] for _ in gpus]
        jobs.sort(key=lambda j: (-(j.gpu_compute_percent or 0), -(j.gpu_memory_mb or 0), j.id))
        for job in jobs:
            mem, comp = job.gpu_memory_mb or 0, job.gpu_compute_percent or 0
            for i, free in enumerate(room):
                if free[0] >= mem and free[1] >= comp and free[0] > 0 and free[1] > 0:
                    free[0] -= mem
                    free[1] -= comp
                    result.fractions[job.id] = gpus[i]
                    break
            else:
                result.unmapped.append(job.id)
