"""Apply a plan: every decision is a compare-and-swap through the job state machine.

A decision is checked again against the database before it is applied: the node must
still be up, the GPUs still free, and the job still on the attempt the snapshot read (the
state machine fences on it). A decision whose preconditions changed is skipped, never
forced; the next cycle decides again from fresh data. Placements are applied in batches
(one conditional UPDATE per job, one INSERT of their events); a job that moved meanwhile is
simply not updated. Start and stop messages leave on commit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

from django.db import connection, transaction
from django.utils import timezone

from fleet.errors import Conflict, NotFound
from fleet.models import GpuRelease, Job, JobState, Node
from fleet.models.jobs import ACTIVE_STATES
from fleet.models.nodes import NodeState as NodeStatus
from fleet.services import messaging
from fleet.services.dispatch import send_start_on_commit
from fleet.services.job_states import SCHEDULER, Dispatch, job_dispatch_many, job_transition
from fleet.services.jobs import stop_previous_attempt
from scheduler.core.model import FULL_COMPUTE, GpuState, PendingJob, Place, Plan, Preempt
from scheduler.cycle.snapshot import DbSnapshot

log = logging.getLogger(__name__)

T = TypeVar("T")
Estimates = dict[int, tuple[int, float | None, str]]
# (job id, reason, queue position, eta) of a waiting job.
WaitRow = tuple[int, str, int | None, datetime | None]


@dataclass
class Outcome:
    placed: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    # Job id -> why its decision was not applied.
    skipped: dict[int, str] = field(default_factory=dict)


class _Occupancy:
    """What assigned and running jobs hold on each GPU now, per the database."""

    def __init__(self) -> None:
        self.used: dict[tuple[int, int], list[int]] = {}
        fields = ("node_id", "gpu_indices", "gpus", "gpu_memory_mb", "gpu_compute_percent")
        rows = list(Job.objects.filter(state__in=ACTIVE_STATES).values_list(*fields))
        # GPUs that stopping attempts still hold count as taken (fleet.services.releases).
        rows += GpuRelease.objects.filter(expires_at__gt=timezone.now()).values_list(*fields)
        for node_id, indices, gpus, mem, comp in rows:
            for index in indices or ():
                self.add(node_id, int(index), gpus, mem, comp)

    def add(self, node_id: int, index: int, gpus: int, mem: int | None, comp: int | None) -> None:
        slot = self.used.setdefault((node_id, index), [0, 0, 0])
        if gpus:
            slot[2] = 1
        else:
            slot[0] += mem or 0
            slot[1] += comp or 0

    def conflict(self, job: PendingJob, node_id: int, gpu: GpuState) -> str | None:
        mem, comp, whole = self.used.get((node_id, gpu.index), (0, 0, 0))
        if whole or (job.gpus and (mem or comp)):
            return f"GPU {gpu.index} is now taken"
        if not job.gpus and (
            mem + (job.gpu_memory_mb or 0) > gpu.memory_mb
            or comp + (job.gpu_compute_percent or 0) > FULL_COMPUTE
        ):
            return f"GPU {gpu.index} no longer has room for the fraction"
        return None


def _check_place(
    snap: DbSnapshot,
    plan: Plan,
    place: Place,
    job: PendingJob | None,
    up: set[str],
    occupancy: _Occupancy,
    gpus_by_node: dict[str, dict[int, GpuState]],
) -> Dispatch | str:
    """The dispatch for one placement, or why it must be skipped. A placement that passes
    is counted on its GPUs at once, so later decisions of the same plan see it."""
    if job is None:
        return "the job was not pending in the snapshot"
    if place.node not in up:
        return f"node {place.node} is no longer up"
    node_id = snap.node_ids[place.node]
    gpus = gpus_by_node.get(place.node, {})
    for index in place.gpu_indices:
        gpu = gpus.get(index)
        if gpu is None:
            return f"node {place.node} has no GPU {index}"
        why = occupancy.conflict(job, node_id, gpu)
        if why is not None:
            return f"{why} on {place.node}"
    for index in place.gpu_indices:
        occupancy.add(node_id, index, job.gpus, job.gpu_memory_mb, job.gpu_compute_percent)
    shown = ", ".join(str(i) for i in place.gpu_indices)
    reason = f"placed by policy {plan.policy} on {place.node} GPU {shown}"
    if place.reason:
        reason += f" ({place.reason})"
    return Dispatch(job.id, snap.attempts[job.id], node_id, tuple(place.gpu_indices), reason)


def _preempt(snap: DbSnapshot, preempt: Preempt) -> tuple[str, str | None]:
    """Preempt (requeue) or, without requeues left, fail one running job."""
    attempt = snap.attempts.get(preempt.job_id)
    if attempt is None:
        return "", "the job was not running in the snapshot"
    requeues, max_requeues = snap.requeues.get(preempt.job_id, (0, 0))
    requeue = preempt.requeue and requeues < max_requeues
    action = "preempt" if requeue else "fail"
    reason = preempt.reason
    if not requeue:
        reason += f"; not requeued: it was requeued {requeues} times (max_requeues {max_requeues})"
    try:
        job = job_transition(
            job_id=preempt.job_id, action=action, actor=SCHEDULER, reason=reason, attempt=attempt
        )
    except (Conflict, NotFound) as exc:
        return action, f"the job changed since the snapshot ({exc.message})"
    # The agent stops the attempt with its grace period (SIGTERM, then SIGKILL).
    stop_previous_attempt(job, reason=reason)
    return action, None


# Decisions per transaction: one commit (one disk flush) per batch rather than per job,
# while row locks on the batch's jobs are held only briefly. Each decision runs in its
# own savepoint, so a refused one undoes nothing else.
BATCH = 200


def _batches(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), BATCH):
        yield items[start : start + BATCH]


def apply_plan(snap: DbSnapshot, plan: Plan) -> Outcome:
    outcome = Outcome()
    up = set(Node.objects.filter(state=NodeStatus.UP).values_list("name", flat=True))
    occupancy = _Occupancy() if plan.places else None
    pending = {j.id: j for j in snap.core.pending}
    gpus_by_node = {n.name: {g.index: g for g in n.gpus} for n in snap.core.nodes}
    for batch in _batches(plan.places):
        assert occupancy is not None
        dispatches: list[Dispatch] = []
        for place in batch:
            checked = _check_place(
                snap, plan, place, pending.get(place.job_id), up, occupancy, gpus_by_node
            )
            if isinstance(checked, str):
                log.info("skipped placing job %s: %s", place.job_id, checked)
                outcome.skipped[place.job_id] = f"placement on {place.node} skipped: {checked}"
            else:
                dispatches.append(checked)
        with transaction.atomic():
            for job in job_dispatch_many(dispatches=dispatches, actor=SCHEDULER):
                send_start_on_commit(job)
                outcome.placed.append(job.pk)
        moved = set(outcome.placed)
        for d in dispatches:
            if d.job_id not in moved:
                outcome.skipped[d.job_id] = (
                    "placement skipped: the job changed since the snapshot "
                    f"(it is no longer pending on attempt {d.attempt})"
                )
    for victims in _batches(plan.preempts):
        with transaction.atomic():
            for preempt in victims:
                action, why = _preempt(snap, preempt)
                if why is not None:
                    log.info("skipped preempting job %s: %s", preempt.job_id, why)
                    outcome.skipped[preempt.job_id] = f"preemption skipped: {why}"
                elif action == "preempt":
                    outcome.preempted.append(preempt.job_id)
                else:
                    outcome.failed.append(preempt.job_id)
            if outcome.preempted or outcome.failed:
                # The victims' GPUs are free in the database now: place their claimants soon.
                messaging.request_schedule()
    return outcome


def wait_rows(snap: DbSnapshot, estimates: Estimates, outcome: Outcome) -> list[WaitRow]:
    """(job id, reason, position, eta) for waiting jobs whose stored values differ.

    Positions count only the jobs still waiting, in the policy's order. ETAs are kept to
    whole seconds: an ETA that moves by microseconds is not worth a write."""
    rows: list[WaitRow] = []
    placed = set(outcome.placed)
    waiting = sorted(
        (item for item in estimates.items() if item[0] not in placed), key=lambda i: i[1][0]
    )
    for position, (job_id, (_, eta, reason)) in enumerate(waiting, start=1):
        skipped = outcome.skipped.get(job_id)
        if skipped is not None:
            reason = f"{skipped}; the next cycle decides again"
        whole = None if eta is None else int(eta)
        if snap.waits.get(job_id) != (reason[:1000], position, whole):
            at = None if whole is None else datetime.fromtimestamp(whole, tz=UTC)
            rows.append((job_id, reason[:1000], position, at))
    return rows


def write_waits(rows: list[WaitRow]) -> int:
    """Store reason, position and ETA for jobs still pending; `state` is never written."""
    if not rows:
        return 0
    if connection.vendor == "postgresql":
        return _write_waits_postgres(rows)
    objs = [
        Job(id=job_id, state_reason=reason, queue_position=position, eta=eta)
        for job_id, reason, position, eta in rows
    ]
    # bulk_update keeps the queryset's filter: jobs no longer pending are left alone.
    return Job.objects.filter(state=JobState.PENDING).bulk_update(
        objs, ["state_reason", "queue_position", "eta"], batch_size=500
    )


def _write_waits_postgres(rows: list[WaitRow]) -> int:
    # One statement over arrays: four parameters, however many rows.
    ids, reasons, positions, etas = (list(column) for column in zip(*rows, strict=True))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Job._meta.db_table} AS j SET state_reason = v.reason, "
            "queue_position = v.pos, eta = v.eta "
            "FROM unnest(%s::bigint[], %s::text[], %s::integer[], %s::timestamptz[]) "
            "AS v(id, reason, pos, eta) WHERE j.id = v.id AND j.state = %s",
            [ids, reasons, positions, etas, JobState.PENDING.value],
        )
        return cursor.rowcount
