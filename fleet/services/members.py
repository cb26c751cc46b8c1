"""The members of an attempt: one per node a job runs on (docs/gangs.md).

A multi-node job is one gang (design rule 10): its members start, stop, fail and requeue
together under one attempt. The job is running once every member has reported its start,
and succeeded once every member has succeeded; when one member fails, times out or is lost,
or the job leaves its nodes for any other reason (cancel, preemption, requeue, a start
timeout), every member still on a node is stopped there, and its GPUs, CPU cores and
memory stay held on that node until that member's end is reported.
"""

from __future__ import annotations

from django.db.models import F, Q
from django.utils import timezone

from fleet.models import Job, JobMember, MemberState, Node
from fleet.services import messaging
from fleet.services.releases import gpu_release_hold_member

# Members that may still have a process on their node.
LIVE = (MemberState.ASSIGNED, MemberState.RUNNING)
# Members whose process has started (or already ended well).
STARTED = (MemberState.RUNNING, MemberState.SUCCEEDED)
ENDED = (MemberState.SUCCEEDED, MemberState.FAILED, MemberState.STOPPED)


def members_stop_on_commit(
    *, job: Job, attempt: int, reason: str, gone_node_id: int | None = None
) -> int:
    """Stop every live member of `attempt`: hold what it has on its node and, after commit,
    tell its node to stop it. A member on `gone_node_id` (the node that reported its end, or
    that is down) is only marked stopped. Returns how many stops were sent. Call inside the
    transaction of the job's transition."""
    live = list(
        JobMember.objects.filter(job_id=job.pk, attempt=attempt, state__in=LIVE).select_related(
            "node"
        )
    )
    sent = 0
    for member in live:
        node_id = member.node_id
        if member.node is None or node_id is None or node_id == gone_node_id:
            continue
        gpu_release_hold_member(
            job=job, attempt=attempt, node_id=node_id, gpu_indices=member.gpu_indices
        )
        messaging.send_to_node_on_commit(
            member.node.name,
            messaging.STOP_JOB_TASK,
            job_id=job.pk,
            attempt=attempt,
            reason=reason,
        )
        sent += 1
    if live:
        JobMember.objects.filter(pk__in=[m.pk for m in live]).update(
            state=MemberState.STOPPED, finished_at=timezone.now()
        )
    return sent


def member_on(*, job_id: int, attempt: int, node: Node) -> JobMember | None:
    return JobMember.objects.filter(job_id=job_id, attempt=attempt, node=node).first()


def on_node(node: Node) -> Q:
    """Jobs whose current attempt has a member on `node` (rank 0 is the job's own node)."""
    return Q(node=node) | Q(members__node=node, members__attempt=F("attempt"), members__rank__gt=0)


def attempt_has_members(*, job_id: int, attempt: int) -> bool:
    return JobMember.objects.filter(job_id=job_id, attempt=attempt).exists()
