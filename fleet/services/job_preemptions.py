"""Batched preemptions: many running jobs taken off their nodes at once, with the same
compare-and-swap per row, events, fences, holds, stop messages and notifications as one
`job_transition` followed by `stop_previous_attempt` each.

A cycle that preempts a few dozen jobs paid about a dozen queries per victim that way (read,
write, event, the job again, its members, each member's node, the hold in a savepoint, the
members, the hold's claimant), and two more per victim for its owner's notification
settings after commit. Here the rows are read and locked with one SELECT and moved with one
UPDATE per action (preempt or fail; each row fenced on its state and attempt as read, its
reason and requeue count its own), and the events, members, nodes, holds and notification
settings are read or written with one statement each for the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django.db.models import Case, Field, Q, Value, When
from django.utils import timezone

from fleet.models import GpuRelease, Job, JobEvent, JobMember, MemberState, Node, NodeState
from fleet.services import messaging
from fleet.services.fences import fence_on_commit
from fleet.services.job_states import ON_NODE, TRANSITIONS, Actor, transition_changes
from fleet.services.members import LIVE
from fleet.services.notifications import notify_many_on_commit
from fleet.services.releases import hold_expiry


@dataclass(frozen=True)
class Stop:
    """One running job to take off its nodes: `action` "preempt" (back to the queue) or
    "fail" (no requeues left), on the attempt the decision was made on; `for_job`: the
    waiting job its GPUs are freed for (recorded on its holds, `GpuRelease.for_job`)."""

    job_id: int
    attempt: int
    action: str
    reason: str
    for_job: int | None = None


_READ = (
    "id", "state", "attempt", "requeues", "assigned_at", "node_id", "gpu_indices", "gpus",
    "gpu_memory_mb", "gpu_compute_percent", "cpus", "memory_mb", "owner_id",
)  # fmt: skip


def job_stop_many(*, stops: list[Stop], actor: Actor) -> dict[int, str | None]:
    """Apply the stops; per job id None when it moved, else why not (the job changed since
    the decision: another attempt, another state, gone). Call inside a transaction: the
    messages and fences go out on its commit."""
    if not stops:
        return {}
    now = timezone.now()
    # The rows are locked as read (in id order, as every batch locks them), so each
    # compare-and-swap below holds: one UPDATE per action moves them all.
    rows = {
        row[0]: row
        for row in Job.objects.select_for_update()
        .filter(id__in=[s.job_id for s in stops])
        .order_by("id")
        .values_list(*_READ)
    }
    out: dict[int, str | None] = {}
    moved: list[tuple[Stop, tuple[Any, ...]]] = []
    updates: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for stop in stops:
        row = rows.get(stop.job_id)
        why = _refusal(stop, row) if stop.job_id not in out else "it is listed twice"
        if why is None:
            assert row is not None
            _, state, attempt, requeues, *_ = row
            update = transition_changes(
                stop.action, attempt=attempt, requeues=requeues, reason=stop.reason, now=now
            )
            updates.setdefault(stop.action, []).append((stop.job_id, update))
            moved.append((stop, row))
        out[stop.job_id] = why
    for action, per_job in updates.items():
        _update(action, per_job, {stop.job_id: row for stop, row in moved})
    if not moved:
        return out
    JobEvent.objects.bulk_create(
        JobEvent(
            job_id=stop.job_id,
            from_state=row[1],
            to_state=TRANSITIONS[stop.action].target,
            attempt=row[2],
            reason=stop.reason[:1000],
            actor_kind=actor.kind,
            actor=actor.name,
        )
        for stop, row in moved
    )
    notify_many_on_commit(
        transitions=[
            (stop.job_id, row[12], row[2], stop.action, stop.reason) for stop, row in moved
        ]
    )
    for stop, row in moved:
        if row[1] in ON_NODE:
            fence_on_commit(job_id=stop.job_id, attempt=row[2], assigned_at=row[4])
    _stop_attempts(moved, now)
    return out


def _update(
    action: str, per_job: list[tuple[int, dict[str, Any]]], rows: dict[int, tuple[Any, ...]]
) -> None:
    """One UPDATE for the jobs of one action: the columns every job gets alike as values,
    the others (reason, requeue count) by job id, fenced on each row's state and attempt
    as read."""
    columns: dict[str, Any] = {}
    for name in per_job[0][1]:
        values = [update[name] for _, update in per_job]
        if all(v == values[0] for v in values):
            columns[name] = values[0]
        else:
            columns[name] = Case(
                *(When(id=job_id, then=Value(update[name])) for job_id, update in per_job),
                output_field=cast(Field, Job._meta.get_field(name)),
            )
    fence = Q()
    for job_id, _ in per_job:
        _, state, attempt, *_ = rows[job_id]
        fence |= Q(id=job_id, state=state, attempt=attempt)
    updated = Job.objects.filter(fence).update(**columns)
    if updated != len(per_job):  # (never, while the rows are locked as read)
        raise RuntimeError(f"{action}: {updated} of {len(per_job)} locked jobs moved")


def _refusal(stop: Stop, row: tuple[Any, ...] | None) -> str | None:
    """Why the stop cannot apply to the row as read (the messages of `job_transition`)."""
    if row is None:
        return f"Job {stop.job_id} does not exist."
    _, state, attempt, *_ = row
    if attempt != stop.attempt:
        return (
            f"Job {stop.job_id} is on attempt {attempt}; "
            f"this {stop.action} was for attempt {stop.attempt}."
        )
    transition = TRANSITIONS[stop.action]
    if state not in transition.sources:
        return (
            f"Job {stop.job_id} is {state}; {stop.action} applies only to {transition.applies_to}."
        )
    return None


def _stop_attempts(moved: list[tuple[Stop, tuple[Any, ...]]], now: Any) -> None:
    """What `stop_previous_attempt` does per job: every live member (or, for an attempt
    dispatched before members were recorded, the job's own node) is held on its node until
    its end is reported, and its node is told to stop it after commit."""
    by_job = {stop.job_id: (stop, row) for stop, row in moved}
    live: list[int] = []  # the live members, all marked stopped
    recorded: set[int] = set()  # jobs whose attempt has member rows
    # (job id, node id, GPU indices) of each part to hold and stop.
    parts: list[tuple[int, int, list[int]]] = []
    for member_id, job_id, attempt, node_id, indices, state in (
        JobMember.objects.filter(job_id__in=list(by_job))
        .order_by("id")
        .values_list("id", "job_id", "attempt", "node_id", "gpu_indices", "state")
    ):
        if attempt != by_job[job_id][1][2]:
            continue
        recorded.add(job_id)
        if state in LIVE:
            live.append(member_id)
            if node_id is not None:
                parts.append((job_id, node_id, indices))
    for job_id, (_, row) in by_job.items():
        if job_id not in recorded and row[5] is not None:
            parts.append((job_id, row[5], list(row[6] or ())))
    if live:
        JobMember.objects.filter(pk__in=live).update(
            state=MemberState.STOPPED, finished_at=timezone.now()
        )
    if not parts:
        return
    nodes = {
        pk: (name, state)
        for pk, name, state in Node.objects.filter(id__in={p[1] for p in parts}).values_list(
            "id", "name", "state"
        )
    }
    expires = hold_expiry(now)
    holds = []
    for job_id, node_id, indices in parts:
        stop, row = by_job[job_id]
        name, state = nodes.get(node_id, (None, NodeState.DOWN))
        if indices and state != NodeState.DOWN:
            holds.append(
                GpuRelease(
                    node_id=node_id,
                    job_id=job_id,
                    attempt=row[2],
                    gpu_indices=[int(i) for i in indices],
                    gpus=row[7],
                    gpu_memory_mb=row[8],
                    gpu_compute_percent=row[9],
                    cpus=row[10],
                    memory_mb=row[11],
                    expires_at=expires,
                    for_job_id=stop.for_job,
                )  # fmt: skip
            )
        if name is not None:
            messaging.send_to_node_on_commit(
                name, messaging.STOP_JOB_TASK, job_id=job_id, attempt=row[2], reason=stop.reason
            )
    # A member already being released keeps its hold (one per member: the unique key).
    GpuRelease.objects.bulk_create(holds, ignore_conflicts=True)
