"""The request mix fragmentation-aware placement scores against: request shapes, their
weights, and the mix read off a snapshot's queue and running jobs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from scheduler.core._capacity_index import Kind, host_request, per_node_gpus
from scheduler.core.fragmentation.params import MAX_SAMPLE, MAX_SHAPES, PRIOR
from scheduler.core.model import FULL_COMPUTE


@dataclass(frozen=True, slots=True)
class DemandShape:
    """One request shape, per node: `gpus` whole GPUs, or (gpus 0) a fraction of one GPU
    with `compute_percent` and `memory_mb` of GPU memory."""

    gpus: int = 1
    compute_percent: int = FULL_COMPUTE
    memory_mb: int = 0
    gpu_model: str | None = None
    min_gpu_memory_mb: int = 0
    cpus: int = 0
    host_memory_mb: int = 0

    def eligible(self, kind: Kind) -> bool:
        if self.gpu_model is not None and self.gpu_model != kind[0]:
            return False
        return kind[1] >= max(self.min_gpu_memory_mb, 0 if self.gpus else self.memory_mb)


Demand = tuple[tuple[DemandShape, float], ...]

# When nothing is known: one whole GPU (then the score ranks like best fit).
DEFAULT_DEMAND: Demand = ((DemandShape(1), 1.0),)


def shape_of(job: Any) -> DemandShape:
    """The per-node shape of a pending or running job."""
    cpus, ram = host_request(job)
    if job.gpus:
        return DemandShape(
            per_node_gpus(job),
            FULL_COMPUTE,
            0,
            getattr(job, "gpu_model", None),
            getattr(job, "min_gpu_memory_mb", None) or 0,
            cpus,
            ram,
        )
    return DemandShape(
        0,
        max(1, min(FULL_COMPUTE, int(job.gpu_compute_percent or 0))),
        int(job.gpu_memory_mb or 0),
        getattr(job, "gpu_model", None),
        getattr(job, "min_gpu_memory_mb", None) or 0,
        cpus,
        ram,
    )


# The last mix given to `normalize` as a tuple, and its answer: a scorer built from a
# snapshot's demand normalizes the very tuple demand_of_snapshot just returned.
_NORMALIZED: list[tuple[Demand, Demand]] = []


def normalize(counts: Iterable[tuple[DemandShape, float]]) -> Demand:
    """Merge equal shapes, keep the MAX_SHAPES heaviest, weights summing to 1."""
    if type(counts) is tuple:
        last = _NORMALIZED[0] if _NORMALIZED else None  # (one read: input and answer agree)
        if last is not None and last[0] is counts:
            return last[1]
        found = _normalize(counts)
        _NORMALIZED[:] = [(counts, found)]
        return found
    return _normalize(counts)


def _normalize(counts: Iterable[tuple[DemandShape, float]]) -> Demand:
    merged: dict[DemandShape, float] = {}
    for shape, weight in counts:
        if weight > 0:
            merged[shape] = merged.get(shape, 0.0) + weight
    kept = sorted(merged.items(), key=lambda item: (-item[1], _order(item[0])))[:MAX_SHAPES]
    total = sum(w for _, w in kept)
    if total <= 0:
        return DEFAULT_DEMAND
    return tuple((shape, w / total) for shape, w in kept)


def _order(shape: DemandShape) -> tuple[Any, ...]:
    return (
        shape.gpus,
        shape.compute_percent,
        shape.memory_mb,
        shape.gpu_model or "",
        shape.min_gpu_memory_mb,
        shape.cpus,
        shape.host_memory_mb,
    )


# Shapes of jobs seen lately, by id (with the job, so a reused id is not mistaken): a
# simulator's or a cycle's next snapshot mostly holds the same frozen job objects.
_SHAPES: dict[int, tuple[Any, DemandShape]] = {}
_SHAPES_MAX = 1 << 16
# The same by id alone, as the shape's number in _SHAPE_LIST, for lookups and counts at C
# speed: _SHAPES holds each job, so no other object can have its id while it is in here.
_NUMBER_BY_ID: dict[int, int] = {}


# One object per distinct shape (numbered in the order first seen), so a sample is counted
# by number (hashing the dataclass for every sampled job was most of what a cycle spent on
# the demand).
_INTERNED: dict[DemandShape, int] = {}
_SHAPE_LIST: list[DemandShape] = []


def _shape_number(job: Any) -> int:
    found = _SHAPES.get(id(job))
    if found is not None and found[0] is job:
        return _INTERNED[found[1]]
    made = shape_of(job)
    number = _INTERNED.get(made)
    if number is None:
        number = _INTERNED[made] = len(_SHAPE_LIST)
        _SHAPE_LIST.append(made)
    _SHAPES[id(job)] = (job, _SHAPE_LIST[number])
    _NUMBER_BY_ID[id(job)] = number
    return number


def demand_from_jobs(jobs: Sequence[Any], sample: int = MAX_SAMPLE) -> Demand:
    """The shape mix of these jobs (an even sample of at most `sample` of them)."""
    if not jobs:
        return DEFAULT_DEMAND
    return _mix(jobs[:: max(1, len(jobs) // sample)])


def _sampled(pending: Sequence[Any], running: Sequence[Any], sample: int) -> list[Any]:
    """`(*pending, *running)[::step]` as demand_from_jobs samples it, without building the
    joined tuple."""
    step = max(1, (len(pending) + len(running)) // sample)
    return [*pending[::step], *running[-len(pending) % step :: step]]


def _mix(sampled: Sequence[Any]) -> Demand:
    n = len(sampled)
    if len(_SHAPES) + n > _SHAPES_MAX:  # (never within a sample: numbers stay valid)
        _SHAPES.clear()
        _NUMBER_BY_ID.clear()
        _INTERNED.clear()
        _SHAPE_LIST.clear()
    numbers = np.fromiter(map(_NUMBER_BY_ID.get, map(id, sampled), repeat(-1, n)), np.int64, n)
    if n and numbers.min() < 0:
        # Only the jobs not seen before are looked at one by one.
        for k in np.flatnonzero(numbers < 0).tolist():
            numbers[k] = _shape_number(sampled[k])
    counts = np.bincount(numbers)
    shapes = _SHAPE_LIST
    return normalize((shapes[k], float(counts[k])) for k in np.flatnonzero(counts).tolist())


def blend(older: Demand, newer: Demand, keep: float) -> Demand:
    """A decayed history: `keep` of the older mix plus the rest of the newer one (keep 0.5
    per cycle halves the weight of what was seen a cycle ago)."""
    keep = min(1.0, max(0.0, keep))
    return normalize([(s, w * keep) for s, w in older] + [(s, w * (1.0 - keep)) for s, w in newer])


_LAST: list[tuple[Any, Any, Demand]] = []


def demand_of_snapshot(snapshot: Any) -> Demand:
    """The snapshot's `demand` when given, else the mix of its pending and running jobs
    with PRIOR of one whole GPU (remembered for the last job lists seen, which a cycle and its ETA forecast share)."""
    given = getattr(snapshot, "demand", ())
    if given:
        return normalize(given)
    pending, running = snapshot.pending, snapshot.running
    last = _LAST[0] if _LAST else None
    if last is not None and last[0] is pending and last[1] is running:
        return last[2]
    mix = _mix(_sampled(pending, running, MAX_SAMPLE)) if pending or running else DEFAULT_DEMAND
    found = normalize([*((sh, w * (1 - PRIOR)) for sh, w in mix), (DEFAULT_DEMAND[0][0], PRIOR)])
    _LAST[:] = [(pending, running, found)]
    return found
