"""Admission at submit: the pure check (scheduler.core.admission) fed from the database.

Every registered node counts, down or draining ones too (they come back). With no GPU
registered yet every request is accepted: the fleet may still be coming up.
"""

from __future__ import annotations

from typing import Any

from fleet.errors import ApplicationError
from fleet.models import Gpu, Team
from scheduler.core.admission import admission_error
from scheduler.core.model import GpuState, NodeState, PendingJob, TeamState

# Which request field a refusal is about, by how the pure message starts.
_FIELDS = (
    ("asks for", "gpus"),
    ("no node has", "gpu_model"),
    ("needs a ", "min_gpu_memory_mb"),
    ("a fractional job", "gpu_memory_mb"),
)


def fleet_nodes() -> tuple[NodeState, ...]:
    """Every node's GPUs, as admission sees them (what is free does not matter)."""
    gpus: dict[int, list[GpuState]] = {}
    for node_id, index, model, memory in Gpu.objects.values_list(
        "node_id", "index", "model", "memory_mb"
    ):
        gpus.setdefault(node_id, []).append(GpuState(index, model, memory, memory))
    return tuple(NodeState(str(node_id), tuple(g)) for node_id, g in gpus.items())


def team_state(team: Team) -> TeamState:
    return TeamState(
        slug=team.slug,
        guaranteed_gpus=team.guaranteed_gpus,
        hard_limit_gpus=team.gpu_limit,
        user_gpu_cap=team.user_gpu_cap,
        priority_weight=team.priority_weight,
        fairshare_weight=team.fairshare_weight,
    )


def pending_job(values: dict[str, Any], team: Team, user: str, *, job_id: int = 0) -> PendingJob:
    """A would-be job from validated submit values (see fleet.services.jobs)."""
    return PendingJob(
        id=job_id,
        team=team.slug,
        user=user,
        submitted_at=0.0,
        time_limit=float(values["time_limit"]),
        gpus=values["gpus"],
        gpu_memory_mb=values.get("gpu_memory_mb"),
        gpu_compute_percent=values.get("gpu_compute_percent"),
        gpu_model=values.get("gpu_model") or None,
        min_gpu_memory_mb=values.get("min_gpu_memory_mb"),
        priority=values.get("priority", 0),
        qos=values.get("qos", "normal"),
        preemptible=values.get("preemptible", False),
        name=values.get("name", ""),
    )


def _field_for(message: str, job: PendingJob) -> str:
    if message.startswith("asks for") and job.gpus == 0:
        return "gpu_compute_percent" if " % " in message else "gpu_memory_mb"
    for prefix, name in _FIELDS:
        if message.startswith(prefix):
            return name
    return "gpus"


def admit(values: dict[str, Any], team: Team, user: str) -> dict[str, Any]:
    """The values with the GPU model spelled as the fleet spells it; ApplicationError (400,
    naming the field) for a job that could never start."""
    nodes = fleet_nodes()
    if not nodes:
        return values
    if values.get("gpu_model"):
        models = sorted({g.model for n in nodes for g in n.gpus})
        wanted = values["gpu_model"].lower()
        canonical = next((m for m in models if m.lower() == wanted), None)
        if canonical is None:
            message = (
                f"No node has GPU model '{values['gpu_model']}'. Models in the fleet: "
                f"{', '.join(models)}."
            )
            raise ApplicationError(message, {"fields": {"gpu_model": [message]}})
        values = {**values, "gpu_model": canonical}
    job = pending_job(values, team, user)
    error = admission_error(job, nodes, team_state(team))
    if error is not None:
        field = _field_for(error, job)
        raise ApplicationError(error, {"fields": {field: [error]}})
    return values
