"""Shaping a job list before a run: jobs too large for a node, a window, a target load.

`prepare` is the pipeline the CLI and the benchmarks use; each step also stands alone.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from scheduler.sim.jobs import JobSpec, assign_time_limits

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_BOUND = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


@dataclass(slots=True)
class PrepReport:
    loaded: int = 0
    dropped_oversize: int = 0
    split_oversize: int = 0
    dropped_zero_duration: int = 0
    kept: int = 0
    arrival_scale: float = 1.0
    offered_load: float = 0.0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "loaded": self.loaded,
            "dropped_oversize": self.dropped_oversize,
            "split_oversize": self.split_oversize,
            "dropped_zero_duration": self.dropped_zero_duration,
            "kept": self.kept,
            "arrival_scale": self.arrival_scale,
            "offered_load": self.offered_load,
            "notes": list(self.notes),
        }


def handle_oversize(
    jobs: list[JobSpec], max_gpus: int, mode: str, report: PrepReport
) -> list[JobSpec]:
    """Jobs asking for more GPUs than the largest node: `drop` them, or `split` each into
    node-sized gangs that run as independent jobs (the simulator has no multi-node gangs)."""
    if mode not in ("drop", "split"):
        raise ValueError(f"oversize mode must be drop or split, not {mode!r}")
    out: list[JobSpec] = []
    for job in jobs:
        if job.gpus <= max_gpus:
            out.append(job)
        elif mode == "drop":
            report.dropped_oversize += 1
        else:
            report.split_oversize += 1
            parts = math.ceil(job.gpus / max_gpus)
            left = job.gpus
            for k in range(parts):
                take = min(max_gpus, left)
                left -= take
                out.append(replace(job, gpus=take, name=f"{job.name or 'job'}-part{k}"))
    return out


def select_window(jobs: list[JobSpec], window: str) -> list[JobSpec]:
    """`START:END` as job positions in submit order (`0:2000`), or as times since the first
    submit with a unit (`2d:5d`, `3600s:7200s`). Either side may be empty."""
    start_text, sep, end_text = window.partition(":")
    if not sep:
        raise ValueError(f"window {window!r} must look like START:END")
    timed = any(t.strip() and t.strip()[-1] in _UNITS for t in (start_text, end_text))

    def bound(text: str, default: float) -> float:
        if not text.strip():
            return default
        m = _BOUND.match(text)
        if not m:
            raise ValueError(f"cannot read window bound {text!r}")
        return float(m.group(1)) * _UNITS.get(m.group(2) or "s", 1.0)

    if timed:
        lo, hi = bound(start_text, 0.0), bound(end_text, math.inf)
        return [j for j in jobs if lo <= j.submit < hi]
    lo_i = int(bound(start_text, 0))
    hi_i = int(bound(end_text, len(jobs)))
    return jobs[lo_i:hi_i]


def offered_load(jobs: list[JobSpec], total_gpus: int) -> float:
    """GPU-seconds of work / (GPUs x arrival span)."""
    if len(jobs) < 2:
        return 0.0
    span = max(j.submit for j in jobs) - min(j.submit for j in jobs)
    work = sum(j.gpu_equivalent * j.duration for j in jobs)
    return work / (total_gpus * span) if span > 0 else math.inf


def shift_and_scale(
    jobs: list[JobSpec], total_gpus: int, load: float | None, report: PrepReport
) -> list[JobSpec]:
    """Start at 0 and, when `load` is given, stretch or squeeze the gaps between arrivals so
    the offered load is `load` (durations are left as they are)."""
    if not jobs:
        return jobs
    t0 = min(j.submit for j in jobs)
    jobs = [replace(j, submit=j.submit - t0) for j in jobs]
    current = offered_load(jobs, total_gpus)
    if load is not None and 0 < current < math.inf:
        scale = current / load
        report.arrival_scale = scale
        jobs = [replace(j, submit=j.submit * scale) for j in jobs]
    report.offered_load = offered_load(jobs, total_gpus)
    return jobs


def prepare(
    jobs: list[JobSpec],
    *,
    total_gpus: int,
    max_node_gpus: int,
    window: str | None = None,
    load: float | None = None,
    oversize: str = "drop",
    seed: int = 0,
    limit_median: float = 2.0,
) -> tuple[list[JobSpec], PrepReport]:
    """Oversize handling, then the window, then shift/scale, then time limits; renumbered
    1..n in submit order so that every run over the same input sees the same ids."""
    report = PrepReport(loaded=len(jobs))
    kept = [j for j in jobs if j.duration > 0]
    report.dropped_zero_duration = len(jobs) - len(kept)
    kept = handle_oversize(kept, max_node_gpus, oversize, report)
    kept.sort(key=lambda j: (j.submit, j.id))
    if window:
        kept = select_window(kept, window)
    kept = shift_and_scale(kept, total_gpus, load, report)
    kept = [replace(j, id=i) for i, j in enumerate(kept, start=1)]
    kept = assign_time_limits(kept, seed=seed, median=limit_median)
    report.kept = len(kept)
    return kept, report


def equal_guarantees(jobs: list[JobSpec], total_gpus: int) -> dict[str, int]:
    """Each team guaranteed an equal whole share of the cluster (at least 1 GPU)."""
    teams = sorted({j.team for j in jobs})
    if not teams:
        return {}
    share = max(1, total_gpus // len(teams))
    return {t: share for t in teams}
