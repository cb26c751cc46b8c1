"""The job state machine: the only code that writes `Job.state`.

Every transition is a conditional UPDATE on (id, state, attempt) inside a transaction
that also writes one JobEvent. A decision made on a stale read therefore changes
nothing (docs/design.md, rules 2 and 3): the update matches no row, and the caller learns why.

Attempts count dispatches: `dispatch` (pending -> assigned) increments `attempt`, so every
report an agent sends carries the attempt it runs and older attempts are fenced off.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Field
from django.utils import timezone

from fleet.errors import Conflict, NotFound
from fleet.models import Job, JobEvent, JobMember, JobState
from fleet.models.jobs import ActorKind
from fleet.services.fences import fence_on_commit
from fleet.services.notifications import notify_on_commit

log = logging.getLogger(__name__)

S = JobState


@dataclass(frozen=True)
class Transition:
    name: str
    sources: frozenset[str]
    target: str
    # What the transition is for, for error messages: "hold applies only to pending jobs".
    applies_to: str


def _t(name: str, sources: tuple[str, ...], target: str, applies_to: str) -> Transition:
    return Transition(name, frozenset(sources), target, applies_to)


TRANSITIONS: dict[str, Transition] = {
    t.name: t
    for t in (
        _t("dispatch", (S.PENDING,), S.ASSIGNED, "pending jobs"),
        _t("start", (S.ASSIGNED,), S.RUNNING, "assigned jobs"),
        _t("succeed", (S.RUNNING,), S.SUCCEEDED, "running jobs"),
        _t("fail", (S.ASSIGNED, S.RUNNING), S.FAILED, "assigned or running jobs"),
        _t("time_out", (S.RUNNING,), S.TIMEOUT, "running jobs"),
        _t(
            "cancel",
            (S.PENDING, S.HELD, S.ASSIGNED, S.RUNNING),
            S.CANCELLED,
            "pending, held, assigned or running jobs",
        ),
        _t("hold", (S.PENDING,), S.HELD, "pending jobs"),
        _t("release", (S.HELD,), S.PENDING, "held jobs"),
        _t(
            "requeue",
            (S.ASSIGNED, S.RUNNING, S.FAILED, S.CANCELLED, S.TIMEOUT, S.LOST),
            S.PENDING,
            "assigned, running or finished jobs",
        ),
        _t("preempt", (S.ASSIGNED, S.RUNNING), S.PENDING, "assigned or running jobs"),
        _t("lose", (S.ASSIGNED, S.RUNNING), S.LOST, "assigned or running jobs"),
        _t("recover", (S.LOST,), S.PENDING, "lost jobs"),
        _t("fail_lost", (S.LOST,), S.FAILED, "lost jobs"),
        _t("undispatch", (S.ASSIGNED,), S.PENDING, "assigned jobs"),
        # The node reports that the attempt succeeded after the control side gave it up
        # (lost, then requeued) but before dispatching it again: the work is done.
        _t("succeed_late", (S.LOST, S.PENDING, S.HELD), S.SUCCEEDED, "lost or requeued jobs"),
    )
}
# States in which an attempt may have a process on its node.
ON_NODE = frozenset({S.ASSIGNED, S.RUNNING})

# Transitions that put a job back in the queue after it held GPUs: they count as requeues.
REQUEUING = frozenset({"requeue", "preempt", "recover"})
ENDING = frozenset({S.SUCCEEDED, S.FAILED, S.TIMEOUT, S.CANCELLED, S.LOST})
# Fields cleared when a job goes back to the queue.
_PLACEMENT_RESET: dict[str, Any] = {
    "node": None,
    "gpu_indices": [],
    "pid": None,
    "assigned_at": None,
    "started_at": None,
    "finished_at": None,
    "exit_code": None,
}


class TransitionRefused(Conflict):
    """The job's state does not allow the transition."""


class StaleAttempt(Conflict):
    """A report or decision for an attempt that is no longer the job's current one."""


@dataclass(frozen=True)
class Actor:
    kind: str
    name: str = ""

    @classmethod
    def user(cls, user: Any) -> Actor:
        return cls(ActorKind.USER, user.get_username())

    @classmethod
    def node(cls, name: str) -> Actor:
        return cls(ActorKind.NODE, name)


SCHEDULER = Actor(ActorKind.SCHEDULER, "scheduler")
SYSTEM = Actor(ActorKind.SYSTEM, "system")


def _changes(action: str, *, attempt: int, requeues: int, reason: str, now: Any) -> dict[str, Any]:
    """The columns a transition writes besides its caller's own fields (one definition for
    the single and the batched path)."""
    transition = TRANSITIONS[action]
    update: dict[str, Any] = {
        "state": transition.target,
        "state_reason": reason[:1000],
        "updated_at": now,
    }
    if action == "dispatch":
        update.update(attempt=attempt + 1, assigned_at=now)
    elif action == "start":
        update["started_at"] = now
    if transition.target == S.PENDING and action != "release":
        update.update(_PLACEMENT_RESET)
        if action in REQUEUING:
            update["requeues"] = requeues + 1
    elif transition.target in ENDING:
        update["finished_at"] = now
    return update


def job_transition(
    *,
    job_id: int,
    action: str,
    actor: Actor,
    reason: str = "",
    attempt: int | None = None,
    fields: dict[str, Any] | None = None,
) -> Job:
    """Apply one transition and return the updated job.

    `attempt` fences the change: when given, the job's current attempt must equal it (agent
    reports and scheduler decisions pass it); when None, the attempt read now is used, so a
    concurrent change between read and write still makes the update miss.

    Raises TransitionRefused when the state does not allow `action`, StaleAttempt when
    `attempt` is not the current one, NotFound when there is no such job.
    """
    transition = TRANSITIONS[action]
    extra = dict(fields or {})
    now = timezone.now()
    with transaction.atomic():
        current = (
            Job.objects.filter(id=job_id)
            .values("state", "attempt", "requeues", "node_id", "gpu_indices", "assigned_at")
            .first()
        )
        if current is None:
            raise NotFound(f"Job {job_id} does not exist.")
        if attempt is not None and attempt != current["attempt"]:
            raise StaleAttempt(
                f"Job {job_id} is on attempt {current['attempt']}; "
                f"this {action} was for attempt {attempt}.",
                {"state": current["state"], "attempt": current["attempt"]},
            )
        if current["state"] not in transition.sources:
            raise TransitionRefused(
                f"Job {job_id} is {current['state']}; {action} applies only to "
                f"{transition.applies_to}.",
                {"state": current["state"], "action": action},
            )
        expected_attempt = current["attempt"]
        update = _changes(
            action, attempt=expected_attempt, requeues=current["requeues"], reason=reason, now=now
        )
        update.update(extra)
        if action == "dispatch" and "node" in extra:
            update["attempt_node"] = extra["node"]
        updated = Job.objects.filter(
            id=job_id, state=current["state"], attempt=expected_attempt
        ).update(**update)
        if updated != 1:
            # Someone changed the row between our read and our write: do not force.
            raise StaleAttempt(
                f"Job {job_id} changed while {action} was being applied; nothing was changed."
            )
        JobEvent.objects.create(
            job_id=job_id,
            from_state=current["state"],
            to_state=transition.target,
            attempt=update.get("attempt", expected_attempt),
            reason=reason[:1000],
            actor_kind=actor.kind,
            actor=actor.name,
        )
        notify_on_commit(job_id=job_id, attempt=expected_attempt, action=action, reason=reason)
        if current["state"] in ON_NODE and transition.target not in ON_NODE:
            # The attempt is over: a start for it still queued at its node must not run.
            fence_on_commit(
                job_id=job_id, attempt=expected_attempt, assigned_at=current["assigned_at"]
            )
    job = Job.objects.select_related("node", "team", "owner").get(id=job_id)
    # What the job was before this transition, for callers that must undo side effects
    # (stop the process of the attempt that was running, on the node that ran it).
    job.previous_state = current["state"]
    job.previous_attempt = expected_attempt
    job.previous_node_id = current["node_id"]
    job.previous_gpu_indices = tuple(current["gpu_indices"] or ())
    return job


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


def job_dispatch_many(*, dispatches: list[Dispatch], actor: Actor) -> list[Job]:
    """Apply many `dispatch` transitions (pending -> assigned) at once and return the jobs
    that moved, with their nodes loaded.

    The same compare-and-swap as `job_transition`, with the expected state and attempt taken
    from the decision instead of read first: one UPDATE per job, one INSERT for all events
    and one SELECT for the results. A job that is no longer pending on that attempt is left
    alone and is absent from the result. Every job that moves gets its member rows (rank 0
    on its own node, then one per further node), in the same INSERT for all. Call inside a
    transaction.
    """
    transition = TRANSITIONS["dispatch"]
    now = timezone.now()
    moved: list[Dispatch] = []
    if connection.vendor == "postgresql" and dispatches:
        done = _dispatch_update_postgres(dispatches, now)
        moved = [d for d in dispatches if d.job_id in done]
    for d in dispatches if connection.vendor != "postgresql" else ():
        update = _changes("dispatch", attempt=d.attempt, requeues=0, reason=d.reason, now=now)
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
    from fleet.services.dispatch import master_ports_choose

    # Rank 0's rendezvous port, chosen for all at once and stored with the member.
    ports = master_ports_choose((d.job_id, d.attempt + 1, d.node_id) for d in moved)
    JobMember.objects.bulk_create(
        JobMember(
            job_id=d.job_id,
            attempt=d.attempt + 1,
            rank=rank,
            node_id=node_id,
            gpu_indices=list(indices),
            master_port=ports[d.job_id] if rank == 0 else None,
        )
        for d in moved
        for rank, (node_id, indices) in enumerate(((d.node_id, d.gpu_indices), *d.members))
    )
    jobs = list(
        Job.objects.select_related("node", "owner", "team", "array").filter(
            id__in=[d.job_id for d in moved]
        )
    )
    for job in jobs:
        job.previous_state = S.PENDING
        job.previous_attempt = job.attempt - 1
        job.dispatched_master_port = ports[job.pk]  # type: ignore[attr-defined]
    return jobs


# What a dispatch writes (see _changes), per job from its decision or the same for all.
_DISPATCH_PER_JOB = {"state_reason", "attempt"}
_DISPATCH_SAME = {"state", "updated_at", "assigned_at"}


def _column(name: str) -> str:
    field = Job._meta.get_field(name)
    assert isinstance(field, Field)
    return str(field.column)


def _dispatch_update_postgres(dispatches: list[Dispatch], now: Any) -> set[int]:
    """The dispatch UPDATE of every job in one statement (one compare-and-swap per row,
    as the per-job path: pending on the decision's attempt); the ids that moved."""
    sample = _changes("dispatch", attempt=0, requeues=0, reason="", now=now)
    assert set(sample) == _DISPATCH_PER_JOB | _DISPATCH_SAME, "dispatch writes other columns"
    col = {name: _column(name) for name in (
        "state", "state_reason", "updated_at", "attempt", "assigned_at", "node",
        "attempt_node", "gpu_indices", "queue_position", "eta",
    )}  # fmt: skip
    rows = ", ".join(
        ["(%s::bigint, %s::integer, %s::bigint, %s::jsonb, %s::text)"] * len(dispatches)
    )
    sql = (
        f'UPDATE {Job._meta.db_table} AS j SET "{col["state"]}" = %s, '
        f'"{col["state_reason"]}" = v.reason, "{col["updated_at"]}" = %s, '
        f'"{col["attempt"]}" = v.attempt + 1, "{col["assigned_at"]}" = %s, '
        f'"{col["node"]}" = v.node_id, "{col["attempt_node"]}" = v.node_id, '
        f'"{col["gpu_indices"]}" = v.gpus, "{col["queue_position"]}" = NULL, '
        f'"{col["eta"]}" = NULL '
        f"FROM (VALUES {rows}) AS v(id, attempt, node_id, gpus, reason) "
        f'WHERE j.id = v.id AND j."{col["state"]}" = %s AND j."{col["attempt"]}" = v.attempt '
        "RETURNING j.id"
    )
    params: list[Any] = [sample["state"], now, now]
    for d in dispatches:
        params += [d.job_id, d.attempt, d.node_id, json.dumps(list(d.gpu_indices)), d.reason[:1000]]
    params.append(S.PENDING)
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
    update = _changes("cancel", attempt=0, requeues=0, reason=reason, now=now)
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


def job_record_ignored(*, job_id: int, action: str, actor: Actor, attempt: int, why: str) -> None:
    """Record a report that was not applied (stale attempt, duplicate, or out of order)."""
    job = Job.objects.filter(id=job_id).values("state").first()
    if job is None:
        log.info("ignored %s for unknown job %s from %s", action, job_id, actor.name)
        return
    JobEvent.objects.create(
        job_id=job_id,
        from_state=job["state"],
        to_state=job["state"],
        attempt=attempt,
        reason=f"ignored {action}: {why}"[:1000],
        actor_kind=actor.kind,
        actor=actor.name,
        applied=False,
    )
