"""Admission control: refuse at submit time a job that could never start.

Checked against every node the fleet lists (down or draining ones too: they come back),
and the team's hard limit and per-user cap. Messages name the numbers so a person can fix
the request ("needs 16 GPUs on one node; the largest node has 8").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from scheduler.core.model import FULL_COMPUTE, NodeState, TeamState


class FleetProfile:
    """What admission needs to know of the fleet, computed once: the GPU models, and per
    GPU kind (model, memory) the most GPUs of that kind on one node."""

    def __init__(self, nodes: Iterable[NodeState]) -> None:
        self.kinds: dict[tuple[str, int], int] = {}
        for node in nodes:
            per_kind: dict[tuple[str, int], int] = {}
            for g in node.gpus:
                key = (g.model, g.memory_mb)
                per_kind[key] = per_kind.get(key, 0) + 1
            for key, count in per_kind.items():
                self.kinds[key] = max(self.kinds.get(key, 0), count)
        self.models = sorted({model for model, _ in self.kinds})

    def error(self, job: Any, team: TeamState | None) -> str | None:
        """Why the job can never start on this fleet under this team's limits, or None."""
        if job.gpus < 0:
            return (
                f"asks for {job.gpus} GPUs; ask for 1 or more, or 0 with a memory and compute share"
            )
        if not self.kinds:
            return "the fleet has no GPUs yet"
        if job.gpus == 0:
            comp = job.gpu_compute_percent or 0
            if not 1 <= comp <= FULL_COMPUTE:
                return f"asks for {comp} % of one GPU; a fractional job takes 1 to {FULL_COMPUTE} %"
            if (job.gpu_memory_mb or 0) <= 0:
                return "a fractional job must ask for some GPU memory (MB)"
        if job.gpu_model is not None and job.gpu_model not in self.models:
            return f"no node has {job.gpu_model} GPUs; the fleet has {', '.join(self.models)}"
        of_model = {
            k: n for k, n in self.kinds.items() if job.gpu_model is None or k[0] == job.gpu_model
        }
        label = f"{job.gpu_model} " if job.gpu_model else ""
        largest = max(mem for _, mem in of_model)
        if job.min_gpu_memory_mb is not None and job.min_gpu_memory_mb > largest:
            return (
                f"needs a {label}GPU with at least {job.min_gpu_memory_mb} MB; "
                f"the largest {label}GPU has {largest} MB"
            )
        if job.gpus == 0:
            mem = job.gpu_memory_mb or 0
            if mem > largest:
                return (
                    f"asks for {mem} MB of one {label}GPU; the largest {label}GPU has {largest} MB"
                )
        else:
            most = max(
                (n for (_, mem), n in of_model.items() if mem >= (job.min_gpu_memory_mb or 0)),
                default=0,
            )
            if job.gpus > most:
                plural = "s" if job.gpus != 1 else ""
                return (
                    f"needs {job.gpus} {label}GPU{plural} on one node; the largest node has {most}"
                )
        return _limit_error(job, team)


_last_profile: tuple[tuple[NodeState, ...], FleetProfile] | None = None


def fleet_profile(nodes: Iterable[NodeState]) -> FleetProfile:
    """The profile of these nodes, reused while callers pass the same (immutable) tuple,
    so checking every waiting job of a snapshot does not rescan the fleet each time."""
    global _last_profile
    if isinstance(nodes, tuple) and _last_profile is not None and _last_profile[0] is nodes:
        return _last_profile[1]
    profile = FleetProfile(nodes)
    if isinstance(nodes, tuple):
        _last_profile = (nodes, profile)
    return profile


def admission_error(job: Any, nodes: Iterable[NodeState], team: TeamState | None) -> str | None:
    """Why the job can never start on this fleet under this team's limits, or None."""
    return fleet_profile(nodes).error(job, team)


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
