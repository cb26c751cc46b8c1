"""Small builders for hand-made snapshots: nodes start empty and running jobs are
subtracted from their GPUs, so free capacity always matches what runs."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

from scheduler.core.model import (
    FULL_COMPUTE,
    GpuState,
    NodeState,
    PendingJob,
    RunningJob,
    Snapshot,
    TeamState,
)

A100_MB = 81920


def node(name: str, gpus: int = 8, model: str = "A100", memory_mb: int = A100_MB, **kw: Any):
    return NodeState(
        name, tuple(GpuState(i, model, memory_mb, memory_mb) for i in range(gpus)), **kw
    )


def job(
    job_id: int,
    gpus: int = 1,
    *,
    team: str = "t",
    user: str = "u",
    submitted: float = 0.0,
    limit: float = 3600.0,
    **kw: Any,
) -> PendingJob:
    return PendingJob(job_id, team, user, submitted, limit, gpus=gpus, **kw)


def frac(job_id: int, mem: int, comp: int, **kw: Any) -> PendingJob:
    return job(job_id, 0, gpu_memory_mb=mem, gpu_compute_percent=comp, **kw)


def running(
    job_id: int,
    node_name: str,
    indices: tuple[int, ...],
    *,
    team: str = "t",
    user: str = "u",
    started: float = 0.0,
    limit: float = 3600.0,
    **kw: Any,
) -> RunningJob:
    kw.setdefault("gpus", len(indices))
    return RunningJob(job_id, team, user, node_name, indices, started, limit, **kw)


def snap(nodes, pending=(), running_jobs=(), *, teams=(), settings=None, now=1000.0) -> Snapshot:
    """A consistent snapshot: each running job's share is taken off its GPUs."""
    return Snapshot(
        now=now,
        nodes=taken_by(nodes, running_jobs),
        running=tuple(running_jobs),
        pending=tuple(pending),
        teams=MappingProxyType({t.slug: t for t in teams}),
        settings=MappingProxyType(dict(settings or {})),
    )


def taken_by(nodes: Any, holders: Any) -> tuple[NodeState, ...]:
    """The nodes with the share of each holder (a running job, or anything with its node,
    GPU indices and request) taken off its GPUs."""
    by_name = {n.name: n for n in nodes}
    for r in holders:
        n = by_name[r.node]
        gpus = list(n.gpus)
        for i in r.gpu_indices:
            g = gpus[i]
            if r.gpus:
                gpus[i] = replace(g, free_memory_mb=0, free_compute_percent=0)
            else:
                gpus[i] = replace(
                    g,
                    free_memory_mb=g.free_memory_mb - (r.gpu_memory_mb or 0),
                    free_compute_percent=g.free_compute_percent - (r.gpu_compute_percent or 0),
                )
                assert gpus[i].free_compute_percent >= 0 and gpus[i].free_memory_mb >= 0
        by_name[r.node] = replace(n, gpus=tuple(gpus))
    return tuple(by_name[n.name] for n in nodes)


def team(slug: str, **kw: Any) -> TeamState:
    return TeamState(slug, **kw)


def placed(plan) -> dict[int, tuple[str, tuple[int, ...]]]:
    return {p.job_id: (p.node, p.gpu_indices) for p in plan.places}


def waits(plan) -> dict[int, str]:
    return {w.job_id: w.reason for w in plan.waits}


__all__ = ["FULL_COMPUTE", "frac", "job", "node", "placed", "running", "snap", "team", "waits"]
