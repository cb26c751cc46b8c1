"""Build the pure scheduler's `Snapshot` from the database, with a few flat queries.

Besides the frozen snapshot the policy sees, `DbSnapshot` keeps what applying a plan needs:
each job's attempt as read (the fence for compare-and-swap), node ids, requeue allowance,
and the pending jobs' current reason, position and ETA (so only changes are written).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import F, FloatField, Func
from django.utils import timezone

from fleet.models import Gpu, GpuRelease, Job, JobEvent, JobMember, JobState, Node, Team
from fleet.models.jobs import ACTIVE_STATES, ActorKind
from fleet.models.nodes import NodeState as NodeStatus
from fleet.services.job_reports import FRESH, RESUMED
from scheduler.core.model import (
    FULL_COMPUTE,
    GpuState,
    NodeState,
    Snapshot,
    TeamState,
)
from scheduler.core.prediction import RuntimePredictor
from scheduler.core.service_distribution import summarize
from scheduler.cycle.config import COMMON, settings_get
from scheduler.cycle.snapshot_jobs import pending_jobs, running_jobs, seconds, seconds_or
from scheduler.cycle.usage import gpu_equivalent, team_usage
from scheduler.policies.gavel import SpeedLearner, speed_key

# Finished states whose runtime says how long such a job really takes.
HISTORY_STATES = (JobState.SUCCEEDED, JobState.TIMEOUT)

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


def epoch(name: str) -> Any:
    """The column in seconds since the epoch. PostgreSQL computes it: parsing tens of
    thousands of timestamps in Python would cost more than the rest of the snapshot."""
    if connection.vendor == "postgresql":
        return Func(
            F(name), template="date_part('epoch', %(expressions)s)", output_field=FloatField()
        )
    return F(name)


@dataclass(frozen=True)
class History:
    """What recent finished jobs teach: runtime ratios per owner and name (predictions), and
    the size distributions `gittins` ranks by (GPU-seconds; runtime / time limit)."""

    predictor: RuntimePredictor
    service: tuple[float, ...] = ()
    limit_ratio: tuple[float, ...] = ()
    # (owner id, name, time limit) -> prediction, filled as snapshots ask.
    predictions: dict[tuple[int, str, int], float | None] = field(
        default_factory=dict, compare=False
    )

    def predict(self, owner: int, name: str, limit: int) -> float | None:
        if self.predictor.observations() == 0:
            return None
        key = (owner, name, limit)
        try:
            return self.predictions[key]
        except KeyError:
            value = self.predictions[key] = self.predictor.predict(str(owner), name, float(limit))
            return value


# The last history learned, with the fingerprint of the rows it was learned from.
_history_cache: dict[str, tuple[str, History]] = {}
_HISTORY_COLUMNS = (
    "owner_id", "name", "time_limit", "gpus", "gpu_compute_percent", "started_at", "finished_at",
)  # fmt: skip


def _history_fingerprint(recent: Any) -> str | None:
    """An md5 of the rows `recent` reads, computed by PostgreSQL (one short row back instead
    of thousands); None elsewhere."""
    if connection.vendor != "postgresql":
        return None
    sql, params = recent.values_list("id", *_HISTORY_COLUMNS).query.sql_with_params()
    names = [f"c{i}" for i in range(len(_HISTORY_COLUMNS) + 1)]  # the id, then the columns
    fields = ", ".join(f"coalesce({n}::text, '-')" for n in names)  # a NULL stays in place
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT md5(string_agg(concat_ws('|', {fields}), ',' ORDER BY c0)) "
            f"FROM ({sql}) AS r({', '.join(names)})",
            params,
        )
        found = cursor.fetchone()
    return None if found is None or found[0] is None else str(found[0])


def learn_history(limit: int) -> History:
    """Learn from the `limit` most recent finished jobs (keyed by owner id).

    On PostgreSQL, when those rows read the same as at the last call (an md5 of them,
    computed by the database), the history of that call is returned, with the predictions
    it has made: a finished job's row seldom changes, and reading and learning 5,000 of them
    every cycle cost more than the rest of the snapshot's pending jobs."""
    if limit <= 0:
        return History(RuntimePredictor())
    recent = Job.objects.filter(
        state__in=HISTORY_STATES, started_at__isnull=False, finished_at__isnull=False
    ).order_by("-id")[:limit]
    fingerprint = _history_fingerprint(recent)
    cached = _history_cache.get("last")
    if fingerprint is not None and cached is not None and cached[0] == fingerprint:
        return cached[1]
    predictor = RuntimePredictor()
    rows = recent.values_list(
        "owner_id", "name", "time_limit", "gpus", "gpu_compute_percent",
        epoch("started_at"), epoch("finished_at"),
    )  # fmt: skip
    sizes: list[float] = []
    ratios: list[float] = []
    for owner, name, limit_s, gpus, comp, started, finished in reversed(list(rows)):
        runtime = max(0.0, seconds_or(finished, 0.0) - seconds_or(started, 0.0))
        predictor.update(str(owner), name, float(limit_s), runtime)
        sizes.append(runtime * gpu_equivalent(gpus, comp))
        ratios.append(min(runtime / float(limit_s), 1.0))
    history = History(predictor, summarize(sizes), summarize(ratios))
    if fingerprint is not None:
        _history_cache["last"] = (fingerprint, history)
    return history


# Seconds a learned speed table is used before finished jobs are read for it again.
SPEED_TABLE_TTL = 300.0
_speed_cache: dict[str, tuple[int, float, Mapping[str, Mapping[str, float]]]] = {}


def learn_speeds(
    limit: int, models: Mapping[tuple[int, int], str], *, now: float
) -> Mapping[str, Mapping[str, float]]:
    """Relative speed per job class and GPU model (gavel's `SpeedLearner`), from the `limit`
    most recent finished jobs that ran in one attempt on GPUs of one model (`models`: (node
    id, GPU index) -> model). Read again at most every SPEED_TABLE_TTL seconds."""
    cached = _speed_cache.get("table")
    if cached is not None and cached[0] == limit and 0 <= now - cached[1] < SPEED_TABLE_TTL:
        return cached[2]
    learner = SpeedLearner()
    rows = (
        Job.objects.filter(
            state__in=HISTORY_STATES, requeues=0, node__isnull=False,
            started_at__isnull=False, finished_at__isnull=False,
        )
        .order_by("-id")
        .values_list(
            "owner__username", "name", "time_limit", "node_id", "gpu_indices", "gpus",
            "gpus_per_node", epoch("started_at"), epoch("finished_at"),
        )[: max(limit, 0)]
    )  # fmt: skip
    for user, name, limit_s, node_id, indices, gpus, per_node, started, finished in rows:
        if per_node and gpus > per_node:
            continue  # a gang's other members may have run on other models
        kinds = {models.get((node_id, int(i))) for i in indices or ()}
        model = kinds.pop() if len(kinds) == 1 else None
        if model is not None and limit_s:
            runtime = seconds_or(finished, 0.0) - seconds_or(started, 0.0)
            learner.observe(speed_key(user or "", name), model, runtime, float(limit_s))
    table = learner.table()
    _speed_cache["table"] = (limit, now, table)
    return table


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


# What one member of an assigned/running attempt, or one stopping attempt's hold, takes on
# its node: (node id, GPU indices, gpus, GPU memory, compute share, CPU cores, host memory).
Allocation = tuple[int, Any, int, int | None, int | None, int, int]


def _nodes(
    allocations: list[Allocation],
) -> tuple[tuple[NodeState, ...], dict[str, int], dict[int, str]]:
    names: dict[int, str] = {}
    states: dict[int, str] = {}
    labels: dict[int, dict[str, str]] = {}
    hosts: dict[int, tuple[int | None, int | None, str]] = {}
    for node_id, name, state, node_labels, cpus, memory_mb, group in Node.objects.values_list(
        "id", "name", "state", "labels", "cpus", "memory_mb", "group"
    ):
        names[node_id], states[node_id] = name, state
        labels[node_id] = {str(k): str(v) for k, v in (node_labels or {}).items()}
        hosts[node_id] = (cpus, memory_mb, group)
    # (node id, index) -> [memory left, compute left]
    used: dict[tuple[int, int], list[int]] = {}
    # node id -> [CPU cores, host memory] taken
    host_used: dict[int, list[int]] = {}
    for node_id, indices, gpus, mem, comp, cpus, memory_mb in allocations:
        taken = host_used.setdefault(node_id, [0, 0])
        taken[0] += cpus or 0
        taken[1] += memory_mb or 0
        for index in indices or ():
            slot = used.setdefault((node_id, int(index)), [0, 0])
            if gpus:
                slot[0], slot[1] = 1 << 40, FULL_COMPUTE
            else:
                slot[0] += mem or 0
                slot[1] += comp or 0
    gpus_of: dict[int, list[GpuState]] = {}
    for node_id, index, model, memory in Gpu.objects.order_by("node_id", "index").values_list(
        "node_id", "index", "model", "memory_mb"
    ):
        mem_used, comp_used = used.get((node_id, index), (0, 0))
        gpus_of.setdefault(node_id, []).append(
            GpuState(
                index,
                model,
                memory,
                max(0, memory - mem_used),
                max(0, FULL_COMPUTE - comp_used),
            )
        )

    def free(total: int | None, taken: int) -> int | None:
        return None if total is None else max(0, total - taken)

    nodes = tuple(
        NodeState(
            names[node_id],
            tuple(gpus_of.get(node_id, ())),
            schedulable=states[node_id] == NodeStatus.UP,
            labels=MappingProxyType(labels[node_id]),
            cpus=hosts[node_id][0],
            memory_mb=hosts[node_id][1],
            free_cpus=free(hosts[node_id][0], host_used.get(node_id, [0, 0])[0]),
            free_memory_mb=free(hosts[node_id][1], host_used.get(node_id, [0, 0])[1]),
            group=hosts[node_id][2],
        )
        for node_id in sorted(names, key=lambda i: names[i])
    )
    return nodes, {name: node_id for node_id, name in names.items()}, names


def _releasing(now: datetime) -> list[Allocation]:
    """What stopping attempts still hold (fleet.models.GpuRelease), one row per member."""
    return list(
        GpuRelease.objects.filter(expires_at__gt=now).values_list(
            "node_id", "gpu_indices", "gpus", "gpu_memory_mb", "gpu_compute_percent", "cpus",
            "memory_mb",
        )
    )  # fmt: skip


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


def build_snapshot(*, now: datetime | None = None, save_usage: bool = True) -> DbSnapshot:
    """Read the fleet as it is now. With `save_usage`, team usage rows are brought up to
    date (the cycle does this under its lock; read-only callers such as estimates do not)."""
    now = now or timezone.now()
    t_now = now.timestamp()
    row = settings_get()
    params = dict(row.params or {})
    active = list(Job.objects.filter(state__in=ACTIVE_STATES).values_list(*_active_fields()))
    pending = list(Job.objects.filter(state=JobState.PENDING).values_list(*_pending_fields()))
    # Rank 0 of every active job is its own row; the other members of multi-node jobs come
    # from their member rows.
    members = gang_members({r[0]: r[17] for r in active if r[19] and r[5] > r[19]})
    allocations: list[Allocation] = []
    for r in active:
        allocations.append((r[3], r[4], r[5], r[6], r[7], r[20], r[21]))
        for _, node_id, indices in members.get(r[0], ()):
            allocations.append((node_id, indices, r[5], r[6], r[7], r[20], r[21]))
    nodes, node_ids, node_names = _nodes(allocations + _releasing(now))

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
    owner_ids = {r[2] for r in active} | {r[2] for r in pending}
    users = dict(get_user_model().objects.filter(id__in=owner_ids).values_list("id", "username"))
    history = learn_history(int(snap.param("prediction_history")))
    snap.predictor = history.predictor
    # Earlier attempts' service, in GPU-seconds like gittins' size distribution.
    earlier = attempt_history({r[0] for r in active if r[14]} | {r[0] for r in pending if r[18]})
    never = Attempts()
    predict = history.predict

    running, runs = running_jobs(
        active,
        t_now=t_now,
        teams=teams,
        users=users,
        node_names=node_names,
        members=members,
        earlier=earlier,
        never=never,
        predict=predict,
    )
    for r in active:
        if r[3] in node_names:
            snap.attempts[r[0]] = r[17]
            snap.requeues[r[0]] = (r[14], r[15])
    queued = pending_jobs(
        pending,
        t_now=t_now,
        teams=teams,
        users=users,
        earlier=earlier,
        never=never,
        predict=predict,
    )
    for r in pending:
        snap.attempts[r[0]] = r[14]
        stored_eta = seconds(r[17])
        snap.waits[r[0]] = (r[15], r[16], None if stored_eta is None else int(stored_eta))

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
        service_distribution=history.service,
        limit_ratio_distribution=history.limit_ratio,
        gpu_speeds=learn_speeds(
            int(snap.param("prediction_history")),
            {(node_ids[n.name], g.index): g.model for n in nodes for g in n.gpus},
            now=t_now,
        ),
    )
    return snap
