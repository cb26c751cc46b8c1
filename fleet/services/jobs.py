"""Job submission and the user actions on jobs (cancel, hold, release, requeue)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from fleet.errors import ApplicationError, NotAllowed
from fleet.models import Job, JobEvent, JobState, Membership, Node, Team
from fleet.models.jobs import PRIORITY_MAX, PRIORITY_MIN, ActorKind, Qos
from fleet.services import messaging
from fleet.services.access import can_manage_job, memberships_of
from fleet.services.job_insert import job_insert_with_event
from fleet.services.job_states import Actor, job_transition
from fleet.services.members import attempt_has_members, members_stop_on_commit
from fleet.services.releases import gpu_release_hold
from scheduler.core.model import NodeState
from scheduler.cycle.admission import admit

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the agent for every job; a job may not override them. FLEET_SIM_* are the job's own
# declaration of its load on a simulated GPU (workers/gpu/simulated.py).
RESERVED_ENV = re.compile(r"^(FLEET_(?!SIM_).*|CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES)$")


@dataclass(frozen=True)
class JobRequest:
    name: str
    command: str
    team: str | None = None
    env: dict[str, str] | None = None
    workdir: str = ""
    gpus: int | None = None
    gpu_memory_mb: int | None = None
    gpu_compute_percent: int | None = None
    gpu_model: str = ""
    min_gpu_memory_mb: int | None = None
    time_limit: int | None = None
    priority: int = 0
    qos: str = Qos.NORMAL
    preemptible: bool = False
    max_requeues: int = 3
    # A multi-node job: gpus in all (or nodes x gpus_per_node), gpus_per_node on each node.
    gpus_per_node: int | None = None
    nodes: int | None = None
    # Host CPU cores and memory per node; None takes the team's per-GPU defaults.
    cpus: int | None = None
    memory_mb: int | None = None
    same_group: bool = False


# What one node's share of a job may ask of its host (the columns hold more).
MAX_CPUS = 65_536
MAX_MEMORY_MB = 2**31 - 1


def _field_error(field: str, message: str) -> ApplicationError:
    return ApplicationError(message, {"fields": {field: [message]}})


def user_memberships(user: Any) -> list[Membership]:
    """The user's memberships with their teams: read once per request (the permission check
    has usually read them already; bulk submits resolve every job's team from them)."""
    return memberships_of(user)


def _resolve_team(user: Any, slug: str | None, memberships: list[Membership] | None) -> Team:
    if memberships is None:
        memberships = user_memberships(user)
    if slug:
        for m in memberships:
            if m.team.slug == slug:
                return m.team
        mine = ", ".join(sorted(m.team.slug for m in memberships)) or "none"
        raise _field_error("team", f"You are not a member of team '{slug}'. Your teams: {mine}.")
    chosen = [m for m in memberships if m.is_default] or list(memberships)
    if not chosen:
        raise NotAllowed("You are not a member of any team; ask an admin to add you to one.")
    if len(chosen) > 1:
        mine = ", ".join(sorted(m.team.slug for m in chosen))
        raise _field_error("team", f"You are in several teams ({mine}); say which one to use.")
    return chosen[0].team


def _validate_env(env: dict[str, Any]) -> dict[str, str]:
    if not isinstance(env, dict):
        raise _field_error("env", "env must be an object mapping names to string values.")
    if len(env) > settings.FLEET_MAX_ENV_VARS:
        raise _field_error(
            "env", f"env has {len(env)} variables; at most {settings.FLEET_MAX_ENV_VARS} allowed."
        )
    size = 0
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise _field_error(
                "env",
                f"'{name}' is not a valid environment variable name: use letters, digits and "
                "underscores, not starting with a digit.",
            )
        if RESERVED_ENV.match(name):
            raise _field_error("env", f"{name} is set by fleet for every job; remove it from env.")
        if not isinstance(value, str):
            raise _field_error("env", f"The value of {name} must be a string.")
        size += len(name.encode()) + len(value.encode())
    if size > settings.FLEET_MAX_ENV_BYTES:
        raise _field_error(
            "env", f"env is {size} bytes; at most {settings.FLEET_MAX_ENV_BYTES} bytes allowed."
        )
    return dict(env)


# Read once: `Qos.values` builds its list on every call (tens of microseconds).
_QOS_VALUES = frozenset(Qos.values)


def _validate_request(req: JobRequest, team: Team) -> dict[str, Any]:
    if not req.name.strip():
        raise _field_error("name", "Give the job a name.")
    if not req.command.strip():
        raise _field_error("command", "The command is empty; give the shell command to run.")
    size = len(req.command.encode())
    if size > settings.FLEET_MAX_COMMAND_BYTES:
        raise _field_error(
            "command",
            f"The command is {size} bytes; at most {settings.FLEET_MAX_COMMAND_BYTES} allowed. "
            "Put long scripts in a file and run that file.",
        )
    fraction = req.gpu_memory_mb is not None or req.gpu_compute_percent is not None
    per_node = req.gpus_per_node or 0
    if per_node < 0:
        raise _field_error("gpus_per_node", "gpus_per_node cannot be negative.")
    gpus = req.gpus if req.gpus is not None else (0 if fraction else per_node or 1)
    if req.nodes is not None:
        if not per_node:
            raise _field_error(
                "nodes",
                "nodes needs gpus_per_node: say how many GPUs the job takes on each node "
                "(it gets nodes x gpus_per_node GPUs in all).",
            )
        if req.nodes < 1:
            raise _field_error("nodes", "nodes must be 1 or more.")
        total = req.nodes * per_node
        if req.gpus is not None and req.gpus != total:
            raise _field_error(
                "gpus",
                f"gpus {req.gpus} is not nodes x gpus_per_node ({req.nodes} x {per_node} = "
                f"{total}); give gpus or nodes, not both.",
            )
        gpus = total
    if gpus < 0:
        raise _field_error("gpus", "gpus cannot be negative.")
    if per_node and (fraction or gpus == 0):
        raise _field_error(
            "gpus_per_node",
            "A job spread over nodes takes whole GPUs; gpus_per_node cannot go with a "
            "fraction of one GPU (gpu_memory_mb, gpu_compute_percent).",
        )
    if per_node and gpus % per_node:
        lower, upper = gpus - gpus % per_node, gpus - gpus % per_node + per_node
        hint = f"ask for {lower} or {upper}" if lower else f"ask for {upper}"
        raise _field_error(
            "gpus",
            f"gpus ({gpus}) must be a multiple of gpus_per_node ({per_node}), one share per "
            f"node: {hint}.",
        )
    if gpus >= 1 and fraction:
        raise _field_error(
            "gpus",
            "Ask for whole GPUs (gpus) or a fraction of one GPU (gpu_memory_mb and "
            "gpu_compute_percent), not both.",
        )
    if gpus == 0:
        if req.gpu_memory_mb is None or req.gpu_compute_percent is None:
            raise _field_error(
                "gpus",
                "Ask for at least one whole GPU (gpus >= 1), or for a fraction of one GPU with "
                "both gpu_memory_mb and gpu_compute_percent.",
            )
        if req.gpu_memory_mb <= 0:
            raise _field_error("gpu_memory_mb", "gpu_memory_mb must be positive.")
        if not 1 <= req.gpu_compute_percent <= 100:
            raise _field_error(
                "gpu_compute_percent", "gpu_compute_percent must be between 1 and 100."
            )
    if req.min_gpu_memory_mb is not None and req.min_gpu_memory_mb <= 0:
        raise _field_error("min_gpu_memory_mb", "min_gpu_memory_mb must be positive.")
    time_limit = req.time_limit if req.time_limit is not None else team.default_time_limit
    if time_limit <= 0:
        raise _field_error("time_limit", "time_limit must be a positive number of seconds.")
    if time_limit > team.max_time_limit:
        raise _field_error(
            "time_limit",
            f"time_limit {time_limit} s is over team {team.slug}'s maximum of "
            f"{team.max_time_limit} s.",
        )
    if not PRIORITY_MIN <= req.priority <= PRIORITY_MAX:
        raise _field_error(
            "priority", f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}."
        )
    if req.qos not in _QOS_VALUES:
        raise _field_error("qos", f"qos must be one of: {', '.join(Qos.values)}.")
    if req.max_requeues < 0:
        raise _field_error("max_requeues", "max_requeues cannot be negative.")
    demand = gpus if gpus else 1
    if team.gpu_limit is not None and demand > team.gpu_limit:
        raise _field_error(
            "gpus",
            f"needs {demand} GPUs; team {team.slug}'s hard limit is {team.gpu_limit} GPUs.",
        )
    if team.user_gpu_cap is not None and demand > team.user_gpu_cap:
        raise _field_error(
            "gpus",
            f"needs {demand} GPUs; team {team.slug} caps each member at {team.user_gpu_cap}.",
        )
    cpus, memory_mb = _host_request(req, team, gpus=gpus, per_node=per_node)
    return {
        "name": req.name.strip()[:200],
        "command": req.command,
        "env": _validate_env(req.env or {}),
        "workdir": req.workdir,
        "gpus": gpus,
        "gpu_memory_mb": req.gpu_memory_mb if gpus == 0 else None,
        "gpu_compute_percent": req.gpu_compute_percent if gpus == 0 else None,
        "gpu_model": req.gpu_model,
        "min_gpu_memory_mb": req.min_gpu_memory_mb,
        "time_limit": time_limit,
        "priority": req.priority,
        "qos": req.qos,
        "preemptible": req.preemptible,
        "max_requeues": req.max_requeues,
        "gpus_per_node": per_node,
        "cpus": cpus,
        "memory_mb": memory_mb,
        "same_group": req.same_group,
    }


def _host_request(req: JobRequest, team: Team, *, gpus: int, per_node: int) -> tuple[int, int]:
    """CPU cores and host memory (MB) the job gets on each node: what it asks, or the team's
    defaults per GPU on that node (a fraction of one GPU: per its compute share)."""
    if req.cpus is not None and not 0 <= req.cpus <= MAX_CPUS:
        raise _field_error("cpus", f"cpus must be between 0 and {MAX_CPUS} cores per node.")
    if req.memory_mb is not None and not 0 <= req.memory_mb <= MAX_MEMORY_MB:
        raise _field_error(
            "memory_mb", f"memory_mb must be between 0 and {MAX_MEMORY_MB} MB per node."
        )
    if gpus:
        share = float(per_node if per_node and gpus > per_node else gpus)
    else:
        share = (req.gpu_compute_percent or 0) / 100
    cpus = req.cpus if req.cpus is not None else math.ceil(team.cpus_per_gpu * share)
    memory_mb = (
        req.memory_mb if req.memory_mb is not None else math.ceil(team.memory_mb_per_gpu * share)
    )
    return min(cpus, MAX_CPUS), min(memory_mb, MAX_MEMORY_MB)


def job_validate(
    *,
    user: Any,
    request: JobRequest,
    memberships: list[Membership] | None = None,
    nodes: tuple[NodeState, ...] | None = None,
) -> tuple[Team, dict[str, Any]]:
    """The team and the job's field values, or ApplicationError saying what to fix.
    Refuses what no node could ever run (scheduler admission). Writes nothing. A request
    that validates many jobs passes the user's `memberships` and the fleet's `nodes`
    (scheduler.cycle.admission.fleet_nodes), read once; by default they are read now."""
    team = _resolve_team(user, request.team, memberships)
    values = _validate_request(request, team)
    return team, admit(values, team, user.get_username(), nodes)


def submitted_event(user: Any) -> JobEvent:
    """A job's first event, "submitted" by `user` (its job left unset: the caller writes
    both, fleet.services.job_insert)."""
    return JobEvent(
        from_state="",
        to_state=JobState.PENDING,
        attempt=0,
        reason="submitted",
        actor_kind=ActorKind.USER,
        actor=user.get_username(),
    )


def job_submit(*, user: Any, request: JobRequest) -> Job:
    team, values = job_validate(user=user, request=request)
    job = Job(owner=user, team=team, **values)
    event = submitted_event(user)
    # One statement for both rows (fleet.services.job_insert); the cycle is asked for once
    # it has committed (at once, outside a transaction).
    job_insert_with_event(job=job, event=event)
    messaging.request_schedule()
    return job


def _require_manager(user: Any, job: Job, verb: str) -> None:
    if not can_manage_job(user, job):
        raise NotAllowed(
            f"Only the job's owner, admins of team {job.team.slug} and staff may {verb} job "
            f"{job.pk}."
        )


def stop_previous_attempt(job: Job, reason: str) -> None:
    """After a transition away from assigned/running, tell the node of each member of that
    attempt to stop it, and keep what it holds busy for the scheduler until it has ended
    (every node of a multi-node job; the job's own node for one dispatched before members
    were recorded)."""
    if job.previous_state not in (JobState.ASSIGNED, JobState.RUNNING):
        return
    if attempt_has_members(job_id=job.pk, attempt=job.previous_attempt):
        members_stop_on_commit(job=job, attempt=job.previous_attempt, reason=reason)
        return
    if job.previous_node_id:
        gpu_release_hold(job=job)
        node_name = Node.objects.filter(id=job.previous_node_id).values_list("name", flat=True)
        for name in node_name:
            messaging.send_to_node_on_commit(
                name,
                messaging.STOP_JOB_TASK,
                job_id=job.pk,
                attempt=job.previous_attempt,
                reason=reason,
            )


PAST = {"cancel": "cancelled", "hold": "held", "release": "released", "requeue": "requeued"}


def _user_action(*, user: Any, job: Job, action: str, verb: str, reason: str) -> Job:
    _require_manager(user, job, verb)
    with transaction.atomic():
        job = job_transition(
            job_id=job.pk,
            action=action,
            actor=Actor.user(user),
            reason=reason or f"{PAST[action]} by {user.get_username()}",
        )
        stop_previous_attempt(job, reason=job.state_reason)
        messaging.request_schedule()
    return job


def job_cancel(*, user: Any, job: Job, reason: str = "") -> Job:
    return _user_action(user=user, job=job, action="cancel", verb="cancel", reason=reason)


def job_hold(*, user: Any, job: Job, reason: str = "") -> Job:
    return _user_action(user=user, job=job, action="hold", verb="hold", reason=reason)


def job_release(*, user: Any, job: Job, reason: str = "") -> Job:
    return _user_action(user=user, job=job, action="release", verb="release", reason=reason)


def job_requeue(*, user: Any, job: Job, reason: str = "") -> Job:
    return _user_action(user=user, job=job, action="requeue", verb="requeue", reason=reason)
