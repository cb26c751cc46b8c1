"""What agents report about attempts, applied through the state machine (design rules 3
and 8).

`job_report_apply` takes one supervisor event, whether it came as its own message or
repeated in a heartbeat (durable outcomes), and applies it idempotently, fenced by attempt:
anything not applicable is recorded with `job_record_ignored`. A report that races another
change of the same job (its "running" applied by another worker a moment earlier) is read
again and applied to what the job is now, never dropped. A success for the job's current
attempt that arrives after the control side gave that attempt up (lost, requeued) but
before it dispatched the job again is applied: the work is done.

A start report may say whether the attempt `resumed` from a checkpoint (its checkpoint
directory held files, workers.executor.checkpoints). Without a migration, that is kept in
the job's events: the start's event reads "attempt N resumed from a checkpoint" (or
"attempt N started fresh"), and each member of a multi-node attempt gets one such event of
its own; fleet.selectors.checkpoints reads it back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from fleet.errors import Conflict
from fleet.models import Job, JobEvent, JobMember, JobState, MemberState, Node
from fleet.models.jobs import ACTIVE_STATES
from fleet.services import messaging
from fleet.services.job_states import SYSTEM, Actor, job_record_ignored, job_transition
from fleet.services.members import ENDED, LIVE, STARTED, members_stop_on_commit
from fleet.services.releases import gpu_release_done

log = logging.getLogger(__name__)

# Supervisor state -> transitions to apply, in order. A report that skips "running" (its
# running report was lost or arrives later) applies the start first, so the job still
# passes through running; the later running report is then recorded as ignored.
# "cancelled" for an attempt the database still runs means the node stopped it on its own:
# it ends as failed, so the job never stays running on a node that no longer runs it.
# "lost": the node stopped it because its lease ran out; it is requeued like a job of a node
# that went down.
REPORT_ACTIONS: dict[str, tuple[str, ...]] = {
    "running": ("start",),
    "succeeded": ("start", "succeed"),
    "failed": ("fail",),
    "timeout": ("start", "time_out"),
    "preempted": ("preempt",),
    "cancelled": ("fail",),
    "lost": ("lose",),
}
# Attempts given up by the control side, for which a late success still counts.
GIVEN_UP = (JobState.LOST, JobState.PENDING, JobState.HELD)
RETRIES = 3
RESUMED = "resumed from a checkpoint"
FRESH = "started fresh"


def resumed_note(attempt: int, resumed: bool | None) -> str:
    """What the job's events say about how the attempt started ("" when not reported)."""
    if resumed is None:
        return ""
    return f"attempt {attempt} {RESUMED if resumed else FRESH}"


def _checked_resumed(node: Node, job_id: int, resumed: Any) -> bool | None:
    """The report's `resumed`, if it is true or false; anything else is left out (the
    report is still applied: what it says of the job's state matters more)."""
    if resumed is None or isinstance(resumed, bool):
        return resumed
    log.warning(
        "node %s reported resumed=%r for job %s; not true or false, left out",
        node.name, resumed, job_id,
    )  # fmt: skip
    return None


def requeue_lost(job: Job, reason: str, *, node_id: int | None = None) -> None:
    """The attempt is lost (its member on `node_id` is gone): requeue the job, or fail it
    once it used up its requeues. Every other member of a multi-node attempt is stopped."""
    lost = job_transition(
        job_id=job.pk, action="lose", actor=SYSTEM, reason=reason, attempt=job.attempt
    )
    if lost.requeues < lost.max_requeues:
        job_transition(
            job_id=job.pk,
            action="recover",
            actor=SYSTEM,
            reason=f"{reason}; requeued ({lost.requeues + 1} of {lost.max_requeues})",
            attempt=job.attempt,
        )
    else:
        job_transition(
            job_id=job.pk,
            action="fail_lost",
            actor=SYSTEM,
            reason=f"{reason}; not requeued: it was requeued {lost.requeues} times already",
            attempt=job.attempt,
        )
    members_stop_on_commit(job=lost, attempt=job.attempt, reason=reason, gone_node_id=node_id)


def job_report_apply(
    *,
    node: Node,
    job_id: int,
    attempt: int,
    state: str,
    pid: int | None = None,
    exit_code: int | None = None,
    reason: str = "",
    resumed: Any = None,
) -> bool:
    """Apply one supervisor event; True when it changed the job. Reports for another
    attempt, another node, or a job no longer assigned/running are recorded and ignored, so
    duplicated and reordered reports change nothing twice. `resumed` (true or false) says
    whether the attempt started from a checkpoint; it is recorded with the attempt's start."""
    actor = Actor.node(node.name)
    checked = _checked_resumed(node, job_id, resumed)
    if state not in REPORT_ACTIONS:
        log.warning("node %s reported unknown state %r for job %s", node.name, state, job_id)
        return False
    if state != "running":
        # Whatever else this report means, the attempt's process on this node is gone.
        gpu_release_done(job_id=job_id, attempt=attempt, node_id=node.pk)
    for _ in range(RETRIES):
        try:
            applied = _apply(node, actor, job_id, attempt, state, pid, exit_code, reason, checked)
        except Conflict:
            continue  # the job changed while this was applied: read it again
        if applied:
            current = Job.objects.filter(id=job_id).values_list("state", flat=True).first()
            if current != JobState.RUNNING:
                messaging.request_schedule()
        return applied
    job_record_ignored(
        job_id=job_id, action=state, actor=actor, attempt=attempt,
        why=f"the job kept changing while this was applied ({RETRIES} tries)",
    )  # fmt: skip
    return False


def _apply(
    node: Node,
    actor: Actor,
    job_id: int,
    attempt: int,
    state: str,
    pid: int | None,
    exit_code: int | None,
    reason: str,
    resumed: bool | None = None,
) -> bool:
    current = (
        Job.objects.filter(id=job_id)
        .values("state", "attempt", "node_id", "attempt_node_id", "gpus", "gpus_per_node")
        .first()
    )
    if current is None:
        log.info("node %s reported %s for unknown job %s", node.name, state, job_id)
        return False
    if current["gpus_per_node"] and current["gpus"] > current["gpus_per_node"]:
        return _apply_gang(node, actor, job_id, attempt, state, pid, exit_code, reason, resumed)
    if state == "succeeded" and _given_up_here(current, node, attempt):
        job_transition(
            job_id=job_id,
            action="succeed_late",
            actor=actor,
            reason="succeeded on its node after it had been given up; not run again",
            attempt=attempt,
            fields={"exit_code": 0},
        )
        return True
    why = ""
    if current["attempt"] != attempt:
        why = f"the job is on attempt {current['attempt']}"
    elif current["node_id"] != node.pk:
        why = "the attempt is not assigned to this node"
    elif current["state"] not in ACTIVE_STATES:
        why = f"the job is already {current['state']}"
    elif state == "running" and current["state"] == JobState.RUNNING:
        why = "the job is already running"
    if why:
        job_record_ignored(job_id=job_id, action=state, actor=actor, attempt=attempt, why=why)
        return False
    if state == "lost":
        with transaction.atomic():
            requeue_lost(
                Job.objects.get(pk=job_id),
                f"stopped on node {node.name}: {reason}",
                node_id=node.pk,
            )
        return True
    if state == "cancelled":
        reason = f"stopped on node {node.name}: {reason or 'cancelled'}"
    with transaction.atomic():
        _member_report(job_id, attempt, node, state, pid, exit_code)
        for action in REPORT_ACTIONS[state]:
            if action == "start" and current["state"] != JobState.ASSIGNED:
                continue
            if action == "start":
                fields: dict[str, Any] = {"pid": pid} if pid else {}
                text = "" if state == "running" else "running (its start report came later)"
                note = resumed_note(attempt, resumed)
                text = f"{text}; {note}" if text and note else text or note
            else:
                fields = {"exit_code": 0 if action == "succeed" else exit_code}
                text = reason
            job_transition(
                job_id=job_id,
                action=action,
                actor=actor,
                reason=text,
                attempt=attempt,
                fields=fields,
            )
    return True


def _member_report(
    job_id: int, attempt: int, node: Node, state: str, pid: int | None, exit_code: int | None
) -> int:
    """Record a report on the member row of this node (if the attempt has one): "running"
    marks it started; any end marks it ended. Returns how many rows changed (0 for a
    duplicate or a report for a member that has already ended)."""
    now = timezone.now()
    member = JobMember.objects.filter(job_id=job_id, attempt=attempt, node=node)
    if state == "running":
        return member.filter(state=MemberState.ASSIGNED).update(
            state=MemberState.RUNNING, pid=pid, started_at=now
        )
    changes: dict[str, Any] = {
        "state": MemberState.SUCCEEDED if state == "succeeded" else MemberState.FAILED,
        "exit_code": 0 if state == "succeeded" else exit_code,
        "started_at": Coalesce(F("started_at"), Value(now)),
        "finished_at": now,
    }
    if pid:
        changes["pid"] = pid
    return member.filter(state__in=LIVE).update(**changes)


# A member's end -> what becomes of the whole job.
GANG_ENDS: dict[str, tuple[str, ...]] = {
    "failed": ("fail",),
    "cancelled": ("fail",),
    "timeout": ("start", "time_out"),
    "preempted": ("preempt",),
}


def _apply_gang(
    node: Node,
    actor: Actor,
    job_id: int,
    attempt: int,
    state: str,
    pid: int | None,
    exit_code: int | None,
    reason: str,
    resumed: bool | None = None,
) -> bool:
    """One member's report for a multi-node job. Reports of one job are applied one at a
    time (the job's row is locked), so two members that start at once cannot both see the
    other still waiting."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(id=job_id).first()
        if job is None:
            return False
        member = JobMember.objects.filter(job_id=job_id, attempt=attempt, node=node).first()
        why = ""
        if member is None:
            why = "the attempt has no member on this node"
        elif job.attempt != attempt:
            why = f"the job is on attempt {job.attempt}"
        elif state == "succeeded" and job.state in GIVEN_UP:
            return _gang_late_success(job, member, actor)
        elif job.state not in ACTIVE_STATES:
            why = f"the job is already {job.state}"
        elif member.state in ENDED:
            why = f"member {member.rank} has already ended ({member.state})"
        elif state == "running" and member.state != MemberState.ASSIGNED:
            why = f"member {member.rank} is already running"
        if why or member is None:
            job_record_ignored(job_id=job_id, action=state, actor=actor, attempt=attempt, why=why)
            return False
        if member.state == MemberState.ASSIGNED and resumed is not None:
            # The member's own start: how it started is its own (per-node storage).
            JobEvent.objects.create(
                job_id=job_id,
                from_state=job.state,
                to_state=job.state,
                attempt=attempt,
                reason=f"member {member.rank} on node {node.name}: "
                f"{resumed_note(attempt, resumed)}",
                actor_kind=actor.kind,
                actor=actor.name,
            )
        _member_report(job_id, attempt, node, state, pid, exit_code)
        members = list(JobMember.objects.filter(job_id=job_id, attempt=attempt))
        started = all(m.state in STARTED for m in members)
        where = f"member {member.rank} on node {node.name}"
        if state in ("running", "succeeded"):
            if started and job.state == JobState.ASSIGNED:
                rank0 = next((m for m in members if m.rank == 0), None)
                job_transition(
                    job_id=job_id,
                    action="start",
                    actor=actor,
                    reason=f"all {len(members)} members started",
                    attempt=attempt,
                    fields={"pid": rank0.pid} if rank0 and rank0.pid else {},
                )
            if all(m.state == MemberState.SUCCEEDED for m in members):
                job_transition(
                    job_id=job_id,
                    action="succeed",
                    actor=actor,
                    reason=f"all {len(members)} members succeeded",
                    attempt=attempt,
                    fields={"exit_code": 0},
                )
            return True
        text = f"{where} {state}" + (f": {reason}" if reason else "")
        if state == "lost":
            requeue_lost(job, text, node_id=node.pk)
            return True
        for action in GANG_ENDS[state]:
            current = Job.objects.filter(id=job_id).values_list("state", flat=True).first()
            if action == "start" and current != JobState.ASSIGNED:
                continue
            fields: dict[str, Any] = (
                {} if action in ("start", "preempt") else {"exit_code": exit_code}
            )
            job_transition(
                job_id=job_id,
                action=action,
                actor=actor,
                reason="running (its start report came later)" if action == "start" else text,
                attempt=attempt,
                fields=fields,
            )
        # The job is over as one: stop every member still on its node.
        members_stop_on_commit(job=job, attempt=attempt, reason=text, gone_node_id=node.pk)
    return True


def _gang_late_success(job: Job, member: JobMember, actor: Actor) -> bool:
    """A member succeeded after the control side gave its attempt up: the job's work is done
    only if every member of that attempt succeeded."""
    JobMember.objects.filter(pk=member.pk).exclude(state=MemberState.SUCCEEDED).update(
        state=MemberState.SUCCEEDED, exit_code=0, finished_at=timezone.now()
    )
    states = set(
        JobMember.objects.filter(job_id=job.pk, attempt=job.attempt).values_list("state", flat=True)
    )
    if states != {MemberState.SUCCEEDED}:
        job_record_ignored(
            job_id=job.pk,
            action="succeeded",
            actor=actor,
            attempt=job.attempt,
            why=f"member {member.rank} succeeded after the job was given up; not every member did",
        )
        return False
    job_transition(
        job_id=job.pk,
        action="succeed_late",
        actor=actor,
        reason="every member succeeded after the job had been given up; not run again",
        attempt=job.attempt,
        fields={"exit_code": 0},
    )
    return True


def _given_up_here(current: Mapping[str, Any], node: Node, attempt: int) -> bool:
    return (
        current["attempt"] == attempt
        and current["state"] in GIVEN_UP
        and current["attempt_node_id"] == node.pk
    )
