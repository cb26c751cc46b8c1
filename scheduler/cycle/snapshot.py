"""Build the pure scheduler's `Snapshot` from the database, with a few flat queries.

Besides the frozen snapshot the policy sees, `DbSnapshot` keeps what applying a plan needs:
each job's attempt as read (the fence for compare-and-swap), node ids, requeue allowance,
and the pending jobs' current reason, position and ETA (so only changes are written).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from fleet.models import GpuRelease, JobEvent, JobMember, JobState, Team
from fleet.models.jobs import ActorKind
from fleet.services.job_reports import FRESH, RESUMED
from scheduler.core.model import (
    Occupant,
    Snapshot,
    TeamState,
)
from scheduler.core.prediction import RuntimePredictor
from scheduler.cycle.config import COMMON, settings_get
from scheduler.cycle.history import (
    learn_history,
    learn_speeds,
)
from scheduler.cycle.snapshot_jobs import (
    JobInputs,
    epoch,
    pending_jobs,
    running_jobs,
    seconds,
    seconds_or,
)
from scheduler.cycle.snapshot_nodes import Allocation, build_nodes
from scheduler.cycle.snapshot_rows import read_job_rows
from scheduler.cycle.usage import team_usage

# (state_reason, queue_position, eta in whole seconds since the epoch)
WaitFields = tuple[str, int | None, int | None]


@dataclass
class DbSnapshot:
    core: Snapshot
    now: datetime
    policy: str
    params: dict[str, Any]
    attempts: dict[int, int] = field(default_factory=dict)
    node_ids: dict[str, int] = field(default_factory=dict)
    # Running/assigned job id -> (requeues, max_requeues).
    requeues: dict[int, tuple[int, int]] = field(default_factory=dict)
    # Pending job id -> (state_reason, queue_position, eta) as stored now.
    waits: dict[int, WaitFields] = field(default_factory=dict)
    # Learned from recent finished jobs; keyed by owner id (as a string) and job name.
    predictor: RuntimePredictor | None = None

    def predict(self, owner_id: int, name: str, time_limit: float) -> float | None:
        if self.predictor is None or self.predictor.observations() == 0:
            return None
        return self.predictor.predict(str(owner_id), name, time_limit)

    def param(self, key: str) -> Any:
        value = self.params.get(key)
        return COMMON[key].default if value is None else value


@dataclass
class Attempts:
    """What a job's events say of its earlier attempts."""

    ran: float = 0.0  # seconds run in earlier attempts (running -> anything)
    queued_at: float | None = None  # when it last entered the queue
    # Whether it resumes from checkpoints: True once an attempt resumed from one, False when
    # a later attempt (2, 3, ...) started fresh and none resumed, None when no node said.
    checkpointed: bool | None = None


def attempt_history(job_ids: set[int]) -> dict[int, Attempts]:
    """Per job, from its events: the service of its earlier attempts, when it last entered
    the queue and whether its attempts resumed from a checkpoint (the agent's word, see
    fleet.services.job_reports). Only requeued jobs have earlier attempts, so callers pass
    just those; a job never requeued entered the queue when it was submitted."""
    if not job_ids:
        return {}
    out: dict[int, Attempts] = {}
    started: dict[int, float] = {}
    events = (
        JobEvent.objects.filter(job_id__in=job_ids, applied=True)
        .order_by("job_id", "id")
        .values_list(
            "job_id", "from_state", "to_state", epoch("at"), "attempt", "actor_kind", "reason"
        )
    )
    for job_id, before, after, at, attempt, actor_kind, reason in events:
        seen = out.get(job_id)
        if seen is None:
            seen = out[job_id] = Attempts()
        t = seconds_or(at, 0.0)
        if before == JobState.RUNNING and after != JobState.RUNNING and job_id in started:
            seen.ran += max(0.0, t - started.pop(job_id))
        if after == JobState.RUNNING:
            started[job_id] = t
        elif after == JobState.PENDING:
            seen.queued_at = t
        if actor_kind == ActorKind.NODE and reason and not seen.checkpointed:
            if f"attempt {attempt} {RESUMED}" in reason:
                seen.checkpointed = True
            elif attempt > 1 and f"attempt {attempt} {FRESH}" in reason:
                seen.checkpointed = False
    return out


def _releasing(
    now: datetime,
) -> tuple[list[Allocation], list[float], dict[int, list[int]], int]:
    """What stopping attempts still hold (fleet.models.GpuRelease), one row per member, and
    when each hold expires (seconds since the epoch); the nodes of the holds made by
    preemptions, by the waiting job each was made for; and how many preempted jobs hold
    them."""
    rows = GpuRelease.objects.filter(expires_at__gt=now).order_by("id").values_list(
        "node_id", "gpu_indices", "gpus", "gpu_memory_mb", "gpu_compute_percent", "cpus",
        "memory_mb", "for_job_id", "job_id", "expires_at",
    )  # fmt: skip
    holds: list[Allocation] = []
    expiry: list[float] = []
    for_job: dict[int, list[int]] = {}
    victims: set[int] = set()
    for *hold, beneficiary, victim, expires_at in rows:
        holds.append(tuple(hold))  # type: ignore[arg-type]
        expiry.append(expires_at.timestamp())
        if beneficiary is not None:
            for_job.setdefault(beneficiary, []).append(hold[0])
            victims.add(victim)
    return holds, expiry, for_job, len(victims)


def hold_occupants(
    holds: list[Allocation], expiry: list[float], node_names: dict[int, str]
) -> tuple[Occupant, ...]:
    """The holds as the reservation search and the forecast read them: each until it
    expires (the agent's report of the end usually frees it sooner)."""
    return tuple(
        Occupant(end, node_names[node_id], tuple(indices), gpus, mem, comp, cpus or 0, ram or 0)
        for (node_id, indices, gpus, mem, comp, cpus, ram), end in zip(holds, expiry, strict=True)
        if node_id in node_names
    )


def gang_members(active: dict[int, int]) -> dict[int, list[tuple[int, int, list[Any]]]]:
    """Ranks 1.. of the current attempt of each multi-node job in `active` (job id ->
    attempt): job id -> [(rank, node id, GPU indices)] in rank order."""
    members: dict[int, list[tuple[int, int, list[Any]]]] = {}
    if not active:
        return members
    rows = (
        JobMember.objects.filter(job_id__in=list(active), rank__gt=0, node__isnull=False)
        .order_by("job_id", "rank")
        .values_list("job_id", "attempt", "rank", "node_id", "gpu_indices")
    )
    for job_id, attempt, rank, node_id, indices in rows:
        if active.get(job_id) == attempt:
            members.setdefault(job_id, []).append((rank, node_id, indices))
    return members


def allocations_of(
    active: list[tuple[Any, ...]], members: dict[int, list[tuple[int, int, list[Any]]]]
) -> list[Allocation]:
    """What each member of these active jobs (rows of `_active_fields()`) takes on its node."""
    allocations: list[Allocation] = []
    for r in active:
        allocations.append((r[3], r[4], r[5], r[6], r[7], r[20], r[21]))
        for _, node_id, indices in members.get(r[0], ()):
            allocations.append((node_id, indices, r[5], r[6], r[7], r[20], r[21]))
    return allocations


def _active_fields() -> tuple[Any, ...]:
    return (
        "id", "team_id", "owner_id", "node_id", "gpu_indices", "gpus", "gpu_memory_mb",
        "gpu_compute_percent", epoch("started_at"), epoch("assigned_at"), "time_limit",
        "priority", "qos", "preemptible", "requeues", "max_requeues", "name", "attempt", "state",
        "gpus_per_node", "cpus", "memory_mb", epoch("submitted_at"),
    )  # fmt: skip


def _pending_fields() -> tuple[Any, ...]:
    return (
        "id", "team_id", "owner_id", epoch("submitted_at"), "time_limit", "gpus",
        "gpu_memory_mb", "gpu_compute_percent", "gpu_model", "min_gpu_memory_mb", "priority",
        "qos", "preemptible", "name", "attempt", "state_reason", "queue_position", epoch("eta"),
        "requeues", "gpus_per_node", "cpus", "memory_mb", "same_group",
    )  # fmt: skip


class RowsDerived:
    """What a snapshot derives from the job rows (`snapshot_rows.JobRows`) alone, kept while
    `read_job_rows` returns the very same lists (nothing changed), and the parts that also
    depend on the gang members or the nodes' names while those read the same."""

    def __init__(self, active: list[tuple[Any, ...]], pending: list[tuple[Any, ...]]) -> None:
        self.active, self.pending = active, pending
        # Multi-node jobs (job id -> attempt): rank 0 of every active job is its own row,
        # the other members of these come from their member rows.
        self.gangs = {r[0]: r[17] for r in active if r[19] and r[5] > r[19]}
        self.owner_ids = {r[2] for r in active} | {r[2] for r in pending}
        self.requeued = {r[0] for r in active if r[14]} | {r[0] for r in pending if r[18]}
        self.pending_attempts = {r[0]: r[14] for r in pending}
        self.waits: dict[int, WaitFields] = {}
        for r in pending:
            stored_eta = seconds(r[17])
            self.waits[r[0]] = (r[15], r[16], None if stored_eta is None else int(stored_eta))
        self._allocations: tuple[Any, list[Allocation]] | None = None
        self._active: tuple[Any, dict[int, int], dict[int, tuple[int, int]]] | None = None

    def allocations(self, members: dict[int, list[tuple[int, int, list[Any]]]]) -> list[Allocation]:
        """What each member of an active job takes on its node."""
        if self._allocations is not None and self._allocations[0] == members:
            return self._allocations[1]
        allocations = allocations_of(self.active, members)
        self._allocations = (members, allocations)
        return allocations

    def active_fences(
        self, node_names: dict[int, str]
    ) -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
        """The attempt and (requeues, max requeues) of each active job whose node exists."""
        if self._active is not None and self._active[0] == node_names:
            return self._active[1], self._active[2]
        attempts: dict[int, int] = {}
        requeues: dict[int, tuple[int, int]] = {}
        for r in self.active:
            if r[3] in node_names:
                attempts[r[0]] = r[17]
                requeues[r[0]] = (r[14], r[15])
        self._active = (node_names, attempts, requeues)
        return attempts, requeues


_derived: RowsDerived | None = None


def rows_derived(active: list[tuple[Any, ...]], pending: list[tuple[Any, ...]]) -> RowsDerived:
    global _derived
    last = _derived
    if last is None or last.active is not active or last.pending is not pending:
        last = _derived = RowsDerived(active, pending)
    return last


def build_snapshot(*, now: datetime | None = None, save_usage: bool = True) -> DbSnapshot:
    """Read the fleet as it is now. With `save_usage`, team usage rows are brought up to
    date (the cycle does this under its lock; read-only callers such as estimates do not)."""
    now = now or timezone.now()
    t_now = now.timestamp()
    row = settings_get()
    params = dict(row.params or {})
    rows = read_job_rows(_active_fields(), _pending_fields())
    active, pending = rows.active, rows.pending
    derived = rows_derived(active, pending)
    members = gang_members(derived.gangs)
    holds, expiry, releasing_for, stopping = _releasing(now)
    nodes, node_ids, node_names = build_nodes(derived.allocations(members) + holds)

    snap = DbSnapshot(
        core=Snapshot(now=t_now, nodes=nodes),
        now=now,
        policy=row.policy,
        params=params,
        node_ids=node_ids,
    )
    teams = {
        t[0]: t for t in Team.objects.values_list(
            "id", "slug", "guaranteed_gpus", "gpu_limit", "user_gpu_cap", "priority_weight",
            "fairshare_weight", "cpu_limit", "memory_mb_limit",
        )
    }  # fmt: skip
    users = dict(
        get_user_model().objects.filter(id__in=derived.owner_ids).values_list("id", "username")
    )
    history = learn_history(int(snap.param("prediction_history")))
    snap.predictor = history.predictor
    # Earlier attempts' service, in GPU-seconds like gittins' size distribution.
    earlier = attempt_history(derived.requeued)
    inputs = JobInputs(t_now, teams, users, earlier, Attempts(), history.predict)
    running, runs = running_jobs(active, inputs, node_names=node_names, members=members)
    attempts, requeues = derived.active_fences(node_names)
    snap.attempts = {**attempts, **derived.pending_attempts}
    snap.requeues = dict(requeues)
    queued = pending_jobs(pending, inputs)
    snap.waits = dict(derived.waits)

    usage = team_usage(
        now=now,
        half_life=float(snap.param("fairshare_half_life")),
        running=runs,
        save=save_usage,
    )
    team_states = {
        slug: TeamState(
            slug=slug,
            guaranteed_gpus=guaranteed,
            hard_limit_gpus=limit,
            user_gpu_cap=cap,
            priority_weight=pw,
            fairshare_weight=fw,
            decayed_usage=usage.get(team_id, 0.0),
            hard_limit_cpus=cpu_limit,
            hard_limit_memory_mb=memory_limit,
        )
        for team_id, slug, guaranteed, limit, cap, pw, fw, cpu_limit, memory_limit in teams.values()
    }
    snap.core = Snapshot(
        now=t_now,
        nodes=nodes,
        running=tuple(running),
        pending=tuple(queued),
        teams=MappingProxyType(team_states),
        settings=MappingProxyType(params),
        releasing_for=MappingProxyType(
            {
                job_id: tuple(sorted({node_names[n] for n in on if n in node_names}))
                for job_id, on in releasing_for.items()
                if any(n in node_names for n in on)
            }
        ),
        preemptions_stopping=stopping,
        holds=hold_occupants(holds, expiry, node_names),
        service_distribution=history.service,
        limit_ratio_distribution=history.limit_ratio,
        gpu_speeds=learn_speeds(
            int(snap.param("prediction_history")),
            {(node_ids[n.name], g.index): g.model for n in nodes for g in n.gpus},
            now=t_now,
        ),
    )
    return snap
