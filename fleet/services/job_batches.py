"""Batched transitions: many jobs moved by one statement each, with the same
compare-and-swap per row as `fleet.services.job_states.job_transition`.

- `job_dispatch_starts`: placements (pending -> assigned), one UPDATE for all on PostgreSQL
  (`UPDATE ... FROM unnest(...)`, fenced on state and attempt per row), with their events
  and member rows, returning what the starts of the jobs that moved need (the scheduling
  cycle's dispatch);
- `job_cancel_queued_many`: a whole job array's queued tasks cancelled at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.db.models import Field
from django.utils import timezone

from fleet.models import Job, JobEvent, JobMember, Node
from fleet.models.jobs import MemberState
from fleet.services.job_states import TRANSITIONS, Actor, S, transition_changes

if TYPE_CHECKING:
    from fleet.services.dispatch import Start


@dataclass(frozen=True)
class Dispatch:
    """One placement to apply: the pending job, the attempt the decision was made on, and
    where it goes."""

    job_id: int
    attempt: int
    node_id: int
    gpu_indices: tuple[int, ...]
    reason: str
    # Ranks 1.. of a multi-node placement: (node id, GPU indices) each.
    members: tuple[tuple[int, tuple[int, ...]], ...] = ()


# What a start needs of each job that moved (fleet.services.dispatch.StartJob), read as values.
_START_FIELDS = (
    "id", "name", "command", "env", "workdir", "time_limit", "gpus", "gpu_memory_mb",
    "gpu_compute_percent", "cpus", "memory_mb", "owner__username", "team__slug", "array_id",
    "array_index", "array__task_count",
)  # fmt: skip


def job_dispatch_starts(*, dispatches: list[Dispatch], actor: Actor) -> list[Start]:
    """Apply many `dispatch` transitions (pending -> assigned) at once and return what the
    starts of the jobs that moved need, in the order of `dispatches`.

    The same compare-and-swap as `job_transition`, with the expected state and attempt taken
    from the decision instead of read first: a job that is no longer pending on that attempt
    is left alone and gets no start. Every job that moves gets its event and its member rows
    (rank 0 on its own node, then one per further node). The starts are read with one SELECT
    of the jobs' columns as values and one of their nodes' names and addresses, no model
    objects. Call inside a transaction, and send the starts on its commit
    (`fleet.services.dispatch.send_starts_on_commit`)."""
    from fleet.services.dispatch import Share, Start, StartJob

    moved, ports, now = _dispatch(dispatches, actor)
    if not moved:
        return []
    rows = {
        row[0]: row
        for row in Job.objects.filter(id__in=[d.job_id for d in moved]).values_list(*_START_FIELDS)
    }
    node_ids = {n for d in moved for n in (d.node_id, *(m[0] for m in d.members))}
    nodes = {
        pk: (name, address or name)
        for pk, name, address in Node.objects.filter(id__in=node_ids).values_list(
            "id", "name", "address"
        )
    }
    starts = []
    for d in moved:
        (_, name, command, env, workdir, time_limit, gpus, gpu_memory_mb, gpu_compute_percent,
         cpus, memory_mb, user, team, array_id, array_index, task_count) = rows[d.job_id]  # fmt: skip
        array = None
        if array_id is not None and array_index is not None:
            array = {"job_id": array_id, "index": array_index, "count": task_count}
        job = StartJob(
            d.job_id, d.attempt + 1, name, command, env, workdir, time_limit, gpus,
            gpu_memory_mb, gpu_compute_percent, cpus, memory_mb, now, user, team, array,
        )  # fmt: skip
        shares = [
            Share(rank, node_id, *nodes[node_id], tuple(int(i) for i in indices))
            for rank, (node_id, indices) in enumerate(((d.node_id, d.gpu_indices), *d.members))
        ]
        starts.append(Start(job, shares, ports[d.job_id]))
    return starts


def _dispatch(
    dispatches: list[Dispatch], actor: Actor
) -> tuple[list[Dispatch], dict[int, int], datetime]:
    """The writes of `job_dispatch_starts`: the dispatches that moved, rank 0's port of each
    by job id, and the time written as their assignment."""
    transition = TRANSITIONS["dispatch"]
    now = timezone.now()
    moved: list[Dispatch] = []
    if connection.vendor == "postgresql" and dispatches:
        done = _dispatch_update_postgres(dispatches, now)
        moved = [d for d in dispatches if d.job_id in done]
    for d in dispatches if connection.vendor != "postgresql" else ():
        update = transition_changes(
            "dispatch", attempt=d.attempt, requeues=0, reason=d.reason, now=now
        )
        update.update(
            node_id=d.node_id,
            attempt_node_id=d.node_id,
            gpu_indices=list(d.gpu_indices),
            queue_position=None,
            eta=None,
        )
        updated = Job.objects.filter(
            id=d.job_id, state__in=transition.sources, attempt=d.attempt
        ).update(**update)
        if updated == 1:
            moved.append(d)
    from fleet.services.dispatch import master_ports_choose

    # Rank 0's rendezvous port, chosen for all at once and stored with the member.
    ports = master_ports_choose((d.job_id, d.attempt + 1, d.node_id) for d in moved)
    members = [
        (
            d.job_id,
            d.attempt + 1,
            rank,
            node_id,
            list(indices),
            ports[d.job_id] if rank == 0 else None,
        )
        for d in moved
        for rank, (node_id, indices) in enumerate(((d.node_id, d.gpu_indices), *d.members))
    ]
    if connection.vendor == "postgresql":
        _insert_postgres(moved, members, actor, now)
    else:
        JobEvent.objects.bulk_create(
            JobEvent(
                job_id=d.job_id,
                from_state=S.PENDING,
                to_state=transition.target,
                attempt=d.attempt + 1,
                reason=d.reason[:1000],
                actor_kind=actor.kind,
                actor=actor.name,
            )
            for d in moved
        )
        JobMember.objects.bulk_create(
            JobMember(
                job_id=job_id, attempt=attempt, rank=rank, node_id=node_id, gpu_indices=indices,
                master_port=port,
            )
            for job_id, attempt, rank, node_id, indices, port in members
        )  # fmt: skip
    return moved, ports, now


def _insert_postgres(
    moved: list[Dispatch], members: list[tuple[Any, ...]], actor: Actor, now: Any
) -> None:
    """The events and member rows of the jobs that moved, one INSERT each over arrays (the
    rows bulk_create would write, without building a model object per row)."""
    if not moved:
        return
    target = TRANSITIONS["dispatch"].target
    event = {f: _column(JobEvent, f) for f in (
        "job", "at", "from_state", "to_state", "attempt", "reason", "actor_kind", "actor",
        "applied",
    )}  # fmt: skip
    member = {f: _column(JobMember, f) for f in (
        "job", "attempt", "rank", "node", "gpu_indices", "state", "master_port",
    )}  # fmt: skip
    job_ids, attempts, ranks, nodes, indices, ports = (list(c) for c in zip(*members, strict=True))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {JobEvent._meta.db_table} ({_quoted(event)}) "
            "SELECT v.job_id, %s, %s, %s, v.attempt, v.reason, %s, %s, true "
            "FROM unnest(%s::bigint[], %s::integer[], %s::text[]) "
            "WITH ORDINALITY AS v(job_id, attempt, reason, n) ORDER BY v.n",
            [
                now, S.PENDING, target, actor.kind, actor.name,
                [d.job_id for d in moved], [d.attempt + 1 for d in moved],
                [d.reason[:1000] for d in moved],
            ],
        )  # fmt: skip
        cursor.execute(
            f"INSERT INTO {JobMember._meta.db_table} ({_quoted(member)}) "
            "SELECT v.job_id, v.attempt, v.rank, v.node_id, v.gpus::jsonb, %s, v.port "
            "FROM unnest(%s::bigint[], %s::integer[], %s::smallint[], %s::bigint[], "
            "%s::text[], %s::integer[]) WITH ORDINALITY "
            "AS v(job_id, attempt, rank, node_id, gpus, port, n) ORDER BY v.n",
            [
                MemberState.ASSIGNED, job_ids, attempts, ranks, nodes,
                [json.dumps(i) for i in indices], ports,
            ],
        )  # fmt: skip


def _quoted(columns: dict[str, str]) -> str:
    return ", ".join(f'"{c}"' for c in columns.values())


# What a dispatch writes (see transition_changes), per job from its decision or the same for all.
_DISPATCH_PER_JOB = {"state_reason", "attempt"}
_DISPATCH_SAME = {"state", "updated_at", "assigned_at"}


def _column(model: Any, name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, Field)
    return str(field.column)


def _dispatch_update_postgres(dispatches: list[Dispatch], now: Any) -> set[int]:
    """The dispatch UPDATE of every job in one statement (one compare-and-swap per row,
    as the per-job path: pending on the decision's attempt); the ids that moved."""
    sample = transition_changes("dispatch", attempt=0, requeues=0, reason="", now=now)
    assert set(sample) == _DISPATCH_PER_JOB | _DISPATCH_SAME, "dispatch writes other columns"
    col = {name: _column(Job, name) for name in (
        "state", "state_reason", "updated_at", "attempt", "assigned_at", "node",
        "attempt_node", "gpu_indices", "queue_position", "eta",
    )}  # fmt: skip
    sql = (
        f'UPDATE {Job._meta.db_table} AS j SET "{col["state"]}" = %s, '
        f'"{col["state_reason"]}" = v.reason, "{col["updated_at"]}" = %s, '
        f'"{col["attempt"]}" = v.attempt + 1, "{col["assigned_at"]}" = %s, '
        f'"{col["node"]}" = v.node_id, "{col["attempt_node"]}" = v.node_id, '
        f'"{col["gpu_indices"]}" = v.gpus::jsonb, "{col["queue_position"]}" = NULL, '
        f'"{col["eta"]}" = NULL '
        "FROM unnest(%s::bigint[], %s::integer[], %s::bigint[], %s::text[], %s::text[]) "
        "AS v(id, attempt, node_id, gpus, reason) "
        f'WHERE j.id = v.id AND j."{col["state"]}" = %s AND j."{col["attempt"]}" = v.attempt '
        "RETURNING j.id"
    )
    # Five arrays, however many jobs: no statement text or parameter list that grows with them.
    params: list[Any] = [
        sample["state"], now, now,
        [d.job_id for d in dispatches], [d.attempt for d in dispatches],
        [d.node_id for d in dispatches], [json.dumps(list(d.gpu_indices)) for d in dispatches],
        [d.reason[:1000] for d in dispatches], S.PENDING,
    ]  # fmt: skip
    assert TRANSITIONS["dispatch"].sources == {S.PENDING}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0] for row in cursor.fetchall()}


def job_cancel_queued_many(*, job_ids: list[int], actor: Actor, reason: str) -> list[int]:
    """Cancel, of `job_ids`, the jobs that are pending or held, all at once (a whole job
    array): their rows are locked and read, then one UPDATE moves them and one INSERT writes
    their events. A row another transaction holds (a scheduling cycle dispatching it) is
    skipped, like any job no longer queued: the caller cancels those one by one with
    `job_transition`, which stops an attempt that started. Returns the ids cancelled. Call
    inside a transaction."""
    transition = TRANSITIONS["cancel"]
    queued = (S.PENDING, S.HELD)
    rows = list(
        Job.objects.select_for_update(skip_locked=True)
        .filter(id__in=job_ids, state__in=queued)
        .order_by("id")
        .values_list("id", "state", "attempt")
    )
    if not rows:
        return []
    now = timezone.now()
    update = transition_changes("cancel", attempt=0, requeues=0, reason=reason, now=now)
    ids = [job_id for job_id, _, _ in rows]
    Job.objects.filter(id__in=ids, state__in=queued).update(**update)
    JobEvent.objects.bulk_create(
        (
            JobEvent(
                job_id=job_id,
                from_state=state,
                to_state=transition.target,
                attempt=attempt,
                reason=reason[:1000],
                actor_kind=actor.kind,
                actor=actor.name,
            )
            for job_id, state, attempt in rows
        ),
        batch_size=2000,
    )
    return ids
