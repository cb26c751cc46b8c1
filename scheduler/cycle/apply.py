"""Apply a plan: every decision is a compare-and-swap through the job state machine.

A decision is checked again against the database before it is applied: every node of the
placement must still be up, its GPUs, CPU cores and host memory still free, and the job
still on the attempt the snapshot read (the state machine fences on it). A multi-node
placement is booked whole, with one member row per node, in the same transaction as the
job's dispatch, and one start per member leaves on commit. A decision whose preconditions changed is skipped, never
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
from django.db.models import Case, F, When
from django.utils import timezone

from fleet.models import GpuRelease, Job, JobMember, JobState, Node
from fleet.models.jobs import ACTIVE_STATES
from fleet.models.nodes import NodeState as NodeStatus
from fleet.services import messaging
from fleet.services.dispatch import send_starts_on_commit
from fleet.services.job_batches import Dispatch, job_dispatch_starts
from fleet.services.job_preemptions import Stop, job_stop_many
from fleet.services.job_states import SCHEDULER
from scheduler.core.model import (
    FULL_COMPUTE,
    GpuState,
    NodeState,
    PendingJob,
    Place,
    Plan,
    Preempt,
)
from scheduler.cycle.snapshot import DbSnapshot
from scheduler.cycle.snapshot_rows import wait_versions, waits_written

log = logging.getLogger(__name__)

T = TypeVar("T")
Estimates = dict[int, tuple[int, float | None, str]]


@dataclass
class Outcome:
    placed: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    # Job id -> why its decision was not applied.
    skipped: dict[int, str] = field(default_factory=dict)


# What one member of a job takes on its node: the columns of a job row, a member row (ranks
# 1.. of a multi-node job, through its job) and a hold.
_TAKES = ("gpus", "gpu_memory_mb", "gpu_compute_percent", "cpus", "memory_mb")


class _Occupancy:
    """What assigned and running jobs (every member) and stopping attempts hold on each GPU
    and each host's CPUs and memory of the given nodes now, per the database: the rows on
    the nodes a plan places on, so the check costs what the plan touches, not the fleet."""

    def __init__(self, node_ids: set[int]) -> None:
        self.used: dict[tuple[int, int], list[int]] = {}
        self.host: dict[int, list[int]] = {}
        ids = sorted(node_ids)
        rows = list(
            Job.objects.filter(state__in=ACTIVE_STATES, node_id__in=ids).values_list(
                "node_id", "gpu_indices", *_TAKES
            )
        )
        # Ranks 1.. of multi-node jobs (rank 0 is the job row's node), their current attempt.
        rows += JobMember.objects.filter(
            node_id__in=ids, rank__gt=0, job__state__in=ACTIVE_STATES, attempt=F("job__attempt")
        ).values_list("node_id", "gpu_indices", *(f"job__{name}" for name in _TAKES))
        # GPUs that stopping attempts still hold count as taken (fleet.services.releases).
        rows += GpuRelease.objects.filter(
            expires_at__gt=timezone.now(), node_id__in=ids
        ).values_list("node_id", "gpu_indices", *_TAKES)
        for node_id, indices, gpus, mem, comp, cpus, memory_mb in rows:
            self.add_host(node_id, cpus, memory_mb)
            for index in indices or ():
                self.add(node_id, int(index), gpus, mem, comp)

    def add(self, node_id: int, index: int, gpus: int, mem: int | None, comp: int | None) -> None:
        slot = self.used.setdefault((node_id, index), [0, 0, 0])
        if gpus:
            slot[2] = 1
        else:
            slot[0] += mem or 0
            slot[1] += comp or 0

    def add_host(self, node_id: int, cpus: int, memory_mb: int) -> None:
        taken = self.host.setdefault(node_id, [0, 0])
        taken[0] += cpus or 0
        taken[1] += memory_mb or 0

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

    def host_conflict(self, job: PendingJob, node_id: int, node: NodeState | None) -> str | None:
        cpus, memory_mb = self.host.get(node_id, (0, 0))
        if node is None:
            return None
        if node.cpus is not None and job.cpus and cpus + job.cpus > node.cpus:
            return f"only {max(0, node.cpus - cpus)} of its {node.cpus} CPU cores are free"
        if (
            node.memory_mb is not None
            and job.memory_mb
            and memory_mb + job.memory_mb > node.memory_mb
        ):
            return (
                f"only {max(0, node.memory_mb - memory_mb)} MB of its {node.memory_mb} MB of "
                "host memory are free"
            )
        return None


def _check_place(
    snap: DbSnapshot,
    plan: Plan,
    place: Place,
    job: PendingJob | None,
    up: set[str],
    occupancy: _Occupancy,
    nodes: dict[str, NodeState],
) -> Dispatch | str:
    """The dispatch for one placement (every member of it), or why it must be skipped. A
    placement that passes is counted on its GPUs and hosts at once, so later decisions of
    the same plan see it. A multi-node placement is taken whole or not at all."""
    if job is None:
        return "the job was not pending in the snapshot"
    shares = place.allocations
    if len(shares) != job.nodes:
        return f"the job spans {job.nodes} nodes; the placement gives {len(shares)}"
    if len({m.node for m in shares}) != len(shares):
        return "the placement puts two members on one node"
    for member in shares:
        if member.node not in up:
            return f"node {member.node} is no longer up"
        if job.nodes > 1 and len(member.gpu_indices) != job.gpus_on_each_node:
            return (
                f"each node takes {job.gpus_on_each_node} GPUs; the placement gives "
                f"{len(member.gpu_indices)} on {member.node}"
            )
        node_id = snap.node_ids[member.node]
        node = nodes.get(member.node)
        gpus = {g.index: g for g in node.gpus} if node is not None else {}
        for index in member.gpu_indices:
            gpu = gpus.get(index)
            if gpu is None:
                return f"node {member.node} has no GPU {index}"
            why = occupancy.conflict(job, node_id, gpu)
            if why is not None:
                return f"{why} on {member.node}"
        why = occupancy.host_conflict(job, node_id, node)
        if why is not None:
            return f"{member.node}: {why}"
    for member in shares:
        node_id = snap.node_ids[member.node]
        occupancy.add_host(node_id, job.cpus, job.memory_mb)
        for index in member.gpu_indices:
            occupancy.add(node_id, index, job.gpus, job.gpu_memory_mb, job.gpu_compute_percent)
    shown = "; ".join(f"{m.node} GPU {', '.join(str(i) for i in m.gpu_indices)}" for m in shares)
    reason = f"placed by policy {plan.policy} on {shown}"
    if place.reason:
        reason += f" ({place.reason})"
    return Dispatch(
        job.id,
        snap.attempts[job.id],
        snap.node_ids[place.node],
        tuple(place.gpu_indices),
        reason,
        members=tuple((snap.node_ids[m.node], tuple(m.gpu_indices)) for m in place.members),
    )


def _stop_of(snap: DbSnapshot, preempt: Preempt) -> Stop | str:
    """The stop that applies a preemption: requeue the job or, without requeues left, fail
    it; or why it cannot apply."""
    attempt = snap.attempts.get(preempt.job_id)
    if attempt is None:
        return "the job was not running in the snapshot"
    requeues, max_requeues = snap.requeues.get(preempt.job_id, (0, 0))
    requeue = preempt.requeue and requeues < max_requeues
    reason = preempt.reason
    if not requeue:
        reason += f"; not requeued: it was requeued {requeues} times (max_requeues {max_requeues})"
    # The agent stops the attempt with its grace period (SIGTERM, then SIGKILL); until it
    # has ended, later cycles let the job it was preempted for wait for these GPUs
    # (Snapshot.releasing_for) rather than preempt again for it.
    action = "preempt" if requeue else "fail"
    return Stop(preempt.job_id, attempt, action, reason, preempt.for_job)


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
    occupancy = None
    if plan.places:
        ids = snap.node_ids
        occupancy = _Occupancy(
            {ids[m.node] for p in plan.places for m in p.allocations if m.node in ids}
        )
    pending = {j.id: j for j in snap.core.pending}
    nodes = {n.name: n for n in snap.core.nodes}
    for batch in _batches(plan.places):
        assert occupancy is not None
        dispatches: list[Dispatch] = []
        for place in batch:
            checked = _check_place(
                snap, plan, place, pending.get(place.job_id), up, occupancy, nodes
            )
            if isinstance(checked, str):
                log.info("skipped placing job %s: %s", place.job_id, checked)
                outcome.skipped[place.job_id] = f"placement on {place.node} skipped: {checked}"
            else:
                dispatches.append(checked)
        with transaction.atomic():
            starts = job_dispatch_starts(dispatches=dispatches, actor=SCHEDULER)
            send_starts_on_commit(starts)
        outcome.placed += [start.job.id for start in starts]
        moved = set(outcome.placed)
        for d in dispatches:
            if d.job_id not in moved:
                outcome.skipped[d.job_id] = (
                    "placement skipped: the job changed since the snapshot "
                    f"(it is no longer pending on attempt {d.attempt})"
                )
    for victims in _batches(plan.preempts):
        with transaction.atomic():
            decided = [(preempt, _stop_of(snap, preempt)) for preempt in victims]
            done = job_stop_many(
                stops=[stop for _, stop in decided if isinstance(stop, Stop)], actor=SCHEDULER
            )
            for preempt, stop in decided:
                why = stop if isinstance(stop, str) else done[stop.job_id]
                if why is None:
                    assert isinstance(stop, Stop)
                    taken = outcome.preempted if stop.action == "preempt" else outcome.failed
                    taken.append(preempt.job_id)
                    continue
                if isinstance(stop, Stop):
                    why = f"the job changed since the snapshot ({why})"
                log.info("skipped preempting job %s: %s", preempt.job_id, why)
                outcome.skipped[preempt.job_id] = f"preemption skipped: {why}"
            if outcome.preempted or outcome.failed:
                # The victims' GPUs are free in the database now: place their claimants soon.
                messaging.request_schedule()
    return outcome


def waiting_order(estimates: Estimates, outcome: Outcome) -> list[tuple[int, str]]:
    """(job id, reason) of the jobs still waiting after the cycle, in the policy's order:
    what queue positions and wait reasons are read from (scheduler.cycle.queue_order). A
    job whose placement was skipped says why."""
    placed = set(outcome.placed)
    ranked = sorted((p[0], job_id) for job_id, p in estimates.items() if job_id not in placed)
    waiting = []
    for _, job_id in ranked:
        reason = estimates[job_id][2]
        skipped = outcome.skipped.get(job_id)
        if skipped is not None:
            reason = f"{skipped}; the next cycle decides again"
        waiting.append((job_id, reason[:1000]))
    return waiting


def clear_stale(snap: DbSnapshot) -> int:
    """Clear what pending rows hold that is no longer shown: a queue position (positions are
    read from the stored order, scheduler.cycle.queue_order; one left by an older version)
    and an ETA already past (the next forecast gives a new one). Returns the rows written.

    Where the snapshot's rows are kept, only rows still as read are written, and their new
    versions are kept (so the next snapshot does not read them again, and the forecast after
    this cycle finds them as this cycle left them)."""
    now = snap.core.now
    ids = [
        job_id
        for job_id, (_, position, eta) in snap.waits.items()
        if position is not None or (eta is not None and eta < now)
    ]
    if not ids:
        return 0
    past = datetime.fromtimestamp(now, tz=UTC)
    versions = wait_versions(ids) if connection.vendor == "postgresql" else None
    if versions is None:
        return Job.objects.filter(id__in=ids, state=JobState.PENDING).update(
            queue_position=None, eta=Case(When(eta__lt=past, then=None), default=F("eta"))
        )
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Job._meta.db_table} AS j SET queue_position = NULL, "
            "eta = CASE WHEN j.eta < %s THEN NULL ELSE j.eta END "
            "FROM unnest(%s::bigint[], %s::text[]) AS v(id, version) "
            "WHERE j.id = v.id AND j.state = %s AND j.xmin::text = v.version "
            "RETURNING j.id, j.xmin::text, j.eta",
            [past, ids, versions, JobState.PENDING.value],
        )
        done = cursor.fetchall()
    waits_written(
        [
            (job_id, version, snap.waits[job_id][0], None, None if eta is None else eta.timestamp())
            for job_id, version, eta in done
        ]
    )
    return len(done)
