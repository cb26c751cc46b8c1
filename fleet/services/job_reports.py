"""What agents report about attempts, applied through the state machine (design rules 3
and 8).

`job_report_apply` takes one supervisor event, whether it came as its own message or
repeated in a heartbeat (durable outcomes), and applies it idempotently, fenced by attempt:
anything not applicable is recorded with `job_record_ignored`. A report that races another
change of the same job (its "running" applied by another worker a moment earlier) is read
again and applied to what the job is now, never dropped. A success for the job's current
attempt that arrives after the control side gave that attempt up (lost, requeued) but
before it dispatched the job again is applied: the work is done.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db import transaction

from fleet.errors import Conflict
from fleet.models import Job, JobState, Node
from fleet.models.jobs import ACTIVE_STATES
from fleet.services import messaging
from fleet.services.job_states import SYSTEM, Actor, job_record_ignored, job_transition
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


def requeue_lost(job: Job, reason: str) -> None:
    """The attempt is lost: requeue the job, or fail it once it used up its requeues."""
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


def job_report_apply(
    *,
    node: Node,
    job_id: int,
    attempt: int,
    state: str,
    pid: int | None = None,
    exit_code: int | None = None,
    reason: str = "",
) -> bool:
    """Apply one supervisor event; True when it changed the job. Reports for another
    attempt, another node, or a job no longer assigned/running are recorded and ignored, so
    duplicated and reordered reports change nothing twice."""
    actor = Actor.node(node.name)
    if state not in REPORT_ACTIONS:
        log.warning("node %s reported unknown state %r for job %s", node.name, state, job_id)
        return False
    if state != "running":
        # Whatever else this report means, the attempt's process is gone.
        gpu_release_done(job_id=job_id, attempt=attempt)
    for _ in range(RETRIES):
        try:
            applied = _apply(node, actor, job_id, attempt, state, pid, exit_code, reason)
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
) -> bool:
    current = (
        Job.objects.filter(id=job_id)
        .values("state", "attempt", "node_id", "attempt_node_id")
        .first()
    )
    if current is None:
        log.info("node %s reported %s for unknown job %s", node.name, state, job_id)
        return False
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
            requeue_lost(Job.objects.get(pk=job_id), f"stopped on node {node.name}: {reason}")
        return True
    if state == "cancelled":
        reason = f"stopped on node {node.name}: {reason or 'cancelled'}"
    with transaction.atomic():
        for action in REPORT_ACTIONS[state]:
            if action == "start" and current["state"] != JobState.ASSIGNED:
                continue
            if action == "start":
                fields: dict[str, Any] = {"pid": pid} if pid else {}
                text = "" if state == "running" else "running (its start report came later)"
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


def _given_up_here(current: Mapping[str, Any], node: Node, attempt: int) -> bool:
    return (
        current["attempt"] == attempt
        and current["state"] in GIVEN_UP
        and current["attempt_node_id"] == node.pk
    )
