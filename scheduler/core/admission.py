"""Admission control: refuse at submit time a job that could never start.

Checked against every node the fleet lists (down or draining ones too: they come back),
and the team's hard limit and per-user cap. Messages name the numbers so a person can fix
the request ("needs 16 GPUs on one node; the largest node has 8").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduler.core.model import FULL_COMPUTE, GpuState, NodeState, TeamState


def _kind_ok(job: Any, gpu: GpuState) -> bool:
    if job.gpu_model is not None and gpu.model != job.gpu_model:
        return False
    return job.min_gpu_memory_mb is None or gpu.memory_mb >= job.min_gpu_memory_mb


def admission_error(job: Any, nodes: Iterable[NodeState], team: TeamState | None) -> str | None:
    """Why the job can never start on this fleet under this team's limits, or None."""
    nodes = tuple(nodes)
    gpus = [g for n in nodes for g in n.gpus]
    if job.gpus < 0:
        return f"asks for {job.gpus} GPUs; ask for 1 or more, or 0 with a memory and compute share"
    if not gpus:
        return "the fleet has no GPUs yet"
    if job.gpus == 0:
        comp = job.gpu_compute_percent or 0
        if not 1 <= comp <= FULL_COMPUTE:
            return f"asks for {comp} % of one GPU; a fractional job takes 1 to {FULL_COMPUTE} %"
        if (job.gpu_memory_mb or 0) <= 0:
            return "a fractional job must ask for some GPU memory (MB)"
    models = sorted({g.model for g in gpus})
    if job.gpu_model is not None and job.gpu_model not in models:
        return f"no node has {job.gpu_model} GPUs; the fleet has {', '.join(models)}"
    of_model = [g for g in gpus if job.gpu_model is None or g.model == job.gpu_model]
    label = f"{job.gpu_model} " if job.gpu_model else ""
    largest = max(g.memory_mb for g in of_model)
    if job.min_gpu_memory_mb is not None and job.min_gpu_memory_mb > largest:
        return (
            f"needs a {label}GPU with at least {job.min_gpu_memory_mb} MB; "
            f"the largest {label}GPU has {largest} MB"
        )
    if job.gpus == 0:
        mem = job.gpu_memory_mb or 0
        if mem > largest:
            return f"asks for {mem} MB of one {label}GPU; the largest {label}GPU has {largest} MB"
    else:
        most = 0
        for node in nodes:
            per_kind: dict[tuple[str, int], int] = {}
            for g in node.gpus:
                if _kind_ok(job, g):
                    key = (g.model, g.memory_mb)
                    per_kind[key] = per_kind.get(key, 0) + 1
            most = max([most, *per_kind.values()])
        if job.gpus > most:
            plural = "s" if job.gpus != 1 else ""
            return f"needs {job.gpus} {label}GPU{plural} on one node; the largest node has {most}"
    return _limit_error(job, team)


def _limit_error(job: Any, team: TeamState | None) -> str | None:
    if team is None:
        return None
    need = job.gpu_equivalent
    shown = f"{need:g}"
    if team.hard_limit_gpus is not None and need > team.hard_limit_gpus:
        return f"needs {shown} GPUs; team {team.slug}'s hard limit is {team.hard_limit_gpus}"
    if team.user_gpu_cap is not None and need > team.user_gpu_cap:
        return f"needs {shown} GPUs; the per-user cap in team {team.slug} is {team.user_gpu_cap}"
    return None
