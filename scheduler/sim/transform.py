"""Shaping a job list before a run: jobs too large for a node, a window, a target load.

`prepare` is the pipeline the CLI and the benchmarks use; each step also stands alone.

Jobs larger than the largest node become multi-node gangs by default (`oversize="gang"`),
as Philly's multi-server jobs were: members of the largest node's size when that divides the
job, else of the largest divisor of the job's GPUs that fits a node (12 GPUs on 8-GPU nodes:
2 x 6). Jobs that ask no host CPUs or memory get them in proportion to their GPUs
(`cpus_per_gpu`, `memory_gb_per_gpu`, per member). Only jobs that can never fit the cluster
(too few nodes of the size and model, too little CPU or memory on any node) are dropped, and
counted (`PrepReport.dropped_unfit`).

`assign_speeds` gives jobs a relative speed per GPU model, drawn from a table of job types
(by default Gavel's measured throughputs, `GAVEL_THROUGHPUTS`), for heterogeneous clusters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from scheduler.sim.cluster import ClusterSpec
from scheduler.sim.jobs import JobSpec, assign_time_limits

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_BOUND = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


@dataclass(slots=True)
class PrepReport:
    loaded: int = 0
    dropped_oversize: int = 0
    split_oversize: int = 0
    ganged: int = 0
    dropped_unfit: int = 0
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
            "ganged": self.ganged,
            "dropped_unfit": self.dropped_unfit,
            "dropped_zero_duration": self.dropped_zero_duration,
            "kept": self.kept,
            "arrival_scale": self.arrival_scale,
            "offered_load": self.offered_load,
            "notes": list(self.notes),
        }


OVERSIZE_MODES = ("gang", "drop", "split")


def gang_width(gpus: int, node_gpus: int) -> int:
    """GPUs per member for a job of `gpus` on nodes of `node_gpus`: the node size when it
    divides the job, else the largest divisor of the job that fits a node."""
    for width in range(min(gpus, node_gpus), 0, -1):
        if gpus % width == 0:
            return width
    return 1


def handle_oversize(
    jobs: list[JobSpec], max_gpus: int, mode: str, report: PrepReport
) -> list[JobSpec]:
    """Jobs asking for more GPUs than the largest node: make each a multi-node `gang`
    (members of `gang_width`), `drop` them, or `split` each into node-sized parts that run
    as independent jobs (the old approximation, kept for comparison)."""
    if mode not in OVERSIZE_MODES:
        raise ValueError(f"oversize mode must be one of {', '.join(OVERSIZE_MODES)}, not {mode!r}")
    out: list[JobSpec] = []
    for job in jobs:
        if job.gpus <= max_gpus or (job.gpus_per_node and job.gpus_per_node <= max_gpus):
            out.append(job)
        elif mode == "gang":
            report.ganged += 1
            out.append(replace(job, gpus_per_node=gang_width(job.gpus, max_gpus)))
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


def with_host_requests(
    jobs: list[JobSpec], cpus_per_gpu: float, memory_gb_per_gpu: float
) -> list[JobSpec]:
    """Give jobs that ask no CPUs (memory) `cpus_per_gpu` (`memory_gb_per_gpu` GiB) per GPU
    of each member, rounded up; a fraction of a GPU asks its share, at least 1 core / 1 MiB."""
    out = []
    for job in jobs:
        per_member = job.gpus_on_each_node if job.gpus else job.gpu_equivalent
        cpus, mem = job.cpus, job.memory_mb
        if not cpus and cpus_per_gpu > 0:
            cpus = max(1, math.ceil(per_member * cpus_per_gpu - 1e-9))
        if not mem and memory_gb_per_gpu > 0:
            mem = max(1, math.ceil(per_member * memory_gb_per_gpu * 1024 - 1e-6))
        out.append(
            job
            if (cpus, mem) == (job.cpus, job.memory_mb)
            else replace(job, cpus=cpus, memory_mb=mem)
        )
    return out


def never_fits(job: JobSpec, cluster: ClusterSpec) -> str | None:
    """Why the job can never start on this cluster, even empty; None when it can."""
    per = job.gpus_on_each_node if job.gpus else 1
    hosts = [
        n
        for n in cluster.nodes
        if n.gpus >= per
        and (job.gpu_model is None or n.model == job.gpu_model)
        and (n.cpus is None or n.cpus >= job.cpus)
        and (n.host_memory_mb is None or n.host_memory_mb >= job.memory_mb)
        and (job.gpus or n.memory_mb >= (job.gpu_memory_mb or 0))
    ]
    if len(hosts) >= job.nodes:
        return None
    what = f"{per} {job.gpu_model + ' ' if job.gpu_model else ''}GPUs"
    if job.cpus:
        what += f", {job.cpus} CPUs"
    if job.memory_mb:
        what += f", {job.memory_mb} MiB of memory"
    return (
        f"a {job.gpus}-GPU job needs {job.nodes} node(s) with {what} each; "
        f"the cluster has {len(hosts)}"
    )


def drop_unfit(jobs: list[JobSpec], cluster: ClusterSpec, report: PrepReport) -> list[JobSpec]:
    kept = []
    for job in jobs:
        why = never_fits(job, cluster)
        if why is None:
            kept.append(job)
        else:
            report.dropped_unfit += 1
            if len(report.notes) < 20:
                report.notes.append(why)
    return kept


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
    oversize: str = "gang",
    seed: int = 0,
    limit_median: float = 2.0,
    cluster: ClusterSpec | None = None,
    cpus_per_gpu: float = 0.0,
    memory_gb_per_gpu: float = 0.0,
) -> tuple[list[JobSpec], PrepReport]:
    """Oversize handling, host requests, what can never fit `cluster` (when given) dropped,
    then the window, then shift/scale, then time limits; renumbered 1..n in submit order so
    that every run over the same input sees the same ids."""
    report = PrepReport(loaded=len(jobs))
    kept = [j for j in jobs if j.duration > 0]
    report.dropped_zero_duration = len(jobs) - len(kept)
    kept = handle_oversize(kept, max_node_gpus, oversize, report)
    kept = with_host_requests(kept, cpus_per_gpu, memory_gb_per_gpu)
    if cluster is not None:
        kept = drop_unfit(kept, cluster, report)
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


# Throughput (training steps per second) of each job type alone on one GPU of each model, as
# Gavel publishes them (github.com/stanford-futuredata/gavel, scheduler/
# combined_throughputs_with_p100.json, the entries for a job with no co-located job; the
# paper's Figure 1 shows the same spread). ResNet-50 is left out: its V100 figure there
# (1.38 steps/s) is half its P100 one (2.76), which no other type shows.
GAVEL_THROUGHPUTS: dict[str, dict[str, float]] = {
    "Transformer": {"V100": 8.7418, "P100": 4.4123, "K80": 1.7486},
    "CycleGAN": {"V100": 3.6756, "P100": 2.4219, "K80": 0.5128},
    "LM": {"V100": 96.2464, "P100": 71.7232, "K80": 1.5766},
    "ResNet-18": {"V100": 46.8173, "P100": 28.5499, "K80": 5.9139},
    "A3C": {"V100": 7.2380, "P100": 4.5464, "K80": 3.1273},
    "Recommendation": {"V100": 0.4302, "P100": 0.2791, "K80": 0.2395},
}


def relative_speeds(throughputs: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """Throughputs per model as speeds relative to the fastest model (1.0), sorted by model."""
    best = max(throughputs.values())
    return tuple((model, round(value / best, 4)) for model, value in sorted(throughputs.items()))


def assign_speeds(
    jobs: list[JobSpec],
    *,
    seed: int = 0,
    table: Mapping[str, Mapping[str, float]] | None = None,
) -> list[JobSpec]:
    """Give every job a type drawn uniformly (seeded) from `table` (job type -> model ->
    throughput; default GAVEL_THROUGHPUTS) and that type's speeds relative to its fastest
    model; a job without a name is named after its type (the class production learns
    speeds for). A job's duration stays its runtime on its fastest model."""
    table = GAVEL_THROUGHPUTS if table is None else table
    types = sorted(table)
    speeds = {t: relative_speeds(table[t]) for t in types}
    picks = np.random.default_rng(seed).integers(0, len(types), size=len(jobs))
    return [
        replace(job, speeds=speeds[types[k]], name=job.name or types[k])
        for job, k in zip(jobs, picks, strict=True)
    ]
