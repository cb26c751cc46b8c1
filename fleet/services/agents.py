"""What agents tell the control side, and what the control side does when they fall silent.

Every message from an agent is signed with its node's key and checked against the node's
public key before any of this runs (fleet.services.wire, fleet.tasks). Then:

- `agent_register` (agent start): GPU inventory, backend, version, and the attempts the
  agent still runs; the node comes back up.
- `agent_heartbeat` (every few seconds): the attempts it runs. Both reconcile (DESIGN.md
  rule 7): attempts the database no longer assigns to that node are sent back to stop;
  an assigned attempt the agent runs is confirmed as started (its start report was lost).
- `job_report_apply`: one supervisor event, applied through the state machine and fenced
  by attempt (rule 3); anything not applicable is recorded with `job_record_ignored`.
- `nodes_reap` (beat): silent nodes go down, their jobs become lost and are requeued or
  failed; assigned jobs whose start was never confirmed go back to the queue (rule 1).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet.errors import Conflict
from fleet.models import Gpu, Job, JobState, Node, NodeState
from fleet.models.jobs import ACTIVE_STATES
from fleet.services import messaging
from fleet.services.job_states import SYSTEM, Actor, job_record_ignored, job_transition
from fleet.services.jobs import stop_previous_attempt
from fleet.services.releases import gpu_release_done, gpu_release_prune, gpu_release_reconcile
from workers.wire import key_generate, public_key_of

log = logging.getLogger(__name__)

# Sent to an agent with the attempts it runs that the database no longer assigns to it.
RECONCILE_TASK = "workers.tasks.reconcile"


def _setting(name: str, default: float) -> float:
    value = getattr(settings, name, None)
    return float(value if value is not None else os.environ.get(name, default))


def start_timeout_s() -> float:
    """How long an assigned job may wait for its node to confirm the start."""
    return _setting("FLEET_START_TIMEOUT", 120)


def missing_grace_s() -> float:
    """How long a running job may be missing from its node's heartbeats before it is lost."""
    return _setting("FLEET_MISSING_GRACE", 30)


# -- credentials ----------------------------------------------------------------------------


def node_key_create(*, name: str) -> tuple[Node, str]:
    """Create the node (down until its agent registers) or give it a new key; the old key
    stops working. Returns the node and its private key, of which only the public half is
    stored."""
    key = key_generate()
    with transaction.atomic():
        node, created = Node.objects.get_or_create(
            name=name,
            defaults={"state": NodeState.DOWN, "state_reason": "waiting for its agent"},
        )
        node.public_key = public_key_of(key)
        node.save(update_fields=["public_key"])
    return node, key


# -- registration and heartbeats ------------------------------------------------------------


# The start of a node's state_reason while its registration names GPUs of other nodes.
REFUSED_GPUS_REASON = "refused GPUs registered to another node"


def _sync_gpus(node: Node, gpus: Sequence[dict[str, Any]]) -> list[str]:
    """Make the node's GPU rows match the inventory; returns what was refused.

    A GPU is its uuid: one that moved to another index of this node is recreated there;
    model and memory are updated in place. A uuid that belongs to another node is refused
    (that GPU's row and history stay as they are): a host cannot take another's GPU by
    naming it. A GPU that really moved is released when its old node's agent registers
    without it (agents register every minute) or when an admin deletes the old node or
    that GPU's row; the new node's next registration then adds it."""
    wanted = {str(g["uuid"]): g for g in gpus}
    rows = list(Gpu.objects.filter(Q(node=node) | Q(uuid__in=list(wanted))).select_related("node"))
    refused = []
    for other in rows:
        if other.node_id != node.pk:
            del wanted[other.uuid]
            refused.append(f"{other.uuid} (node {other.node.name})")
            log.warning(
                "node %s registered GPU %s, which is registered to node %s: refused",
                node.name,
                other.uuid,
                other.node.name,
            )
    rows = [r for r in rows if r.node_id == node.pk]
    stale = [r.pk for r in rows if r.uuid not in wanted or r.index != int(wanted[r.uuid]["index"])]
    Gpu.objects.filter(pk__in=stale).delete()
    kept = {r.uuid: r for r in rows if r.pk not in stale}
    for uuid, info in wanted.items():
        model, memory = str(info["model"]), int(info["memory_total_mb"])
        row = kept.get(uuid)
        if row is None:
            Gpu.objects.create(
                node=node, index=int(info["index"]), uuid=uuid, model=model, memory_mb=memory
            )
        elif (row.model, row.memory_mb) != (model, memory):
            Gpu.objects.filter(pk=row.pk).update(model=model, memory_mb=memory)
    return refused


def _note_refused_gpus(node: Node, refused: list[str]) -> None:
    """Say on an up node why GPUs of its inventory are missing (its state_reason, which
    the node pages and API show), and clear that once its registration is accepted whole.
    A draining or down node keeps its own reason; the refusal is in the log."""
    mine = Node.objects.filter(pk=node.pk, state=NodeState.UP)
    if refused:
        note = f"{REFUSED_GPUS_REASON}: {', '.join(refused)}"
        mine.filter(Q(state_reason="") | Q(state_reason__startswith=REFUSED_GPUS_REASON)).update(
            state_reason=note[:500]
        )
    else:
        mine.filter(state_reason__startswith=REFUSED_GPUS_REASON).update(state_reason="")


def _node_seen(node: Node, now: datetime) -> None:
    Node.objects.filter(pk=node.pk).update(last_heartbeat=now)
    down = Node.objects.filter(pk=node.pk, state=NodeState.DOWN)
    came_back = down.filter(drain_requested=False).update(state=NodeState.UP, state_reason="")
    came_back += down.filter(drain_requested=True).update(
        state=NodeState.DRAINING, state_reason="back from down; still draining"
    )
    if came_back:
        log.info("node %s is up", node.name)
        messaging.request_schedule()


def agent_register(
    *,
    node: Node,
    backend: str,
    agent_version: str,
    gpus: Sequence[dict[str, Any]],
    running: Iterable[Sequence[Any]] = (),
    now: datetime | None = None,
) -> list[tuple[int, int]]:
    """Record the node's inventory (idempotent) and reconcile; returns the attempts the
    agent is told to stop."""
    now = now or timezone.now()
    with transaction.atomic():
        # A write first: SQLite then takes its write lock at once (waiting for it) instead
        # of failing when a read transaction tries to upgrade.
        Node.objects.filter(pk=node.pk).update(
            gpu_backend=backend[:20], agent_version=agent_version[:50]
        )
        refused = _sync_gpus(node, gpus)
        _node_seen(node, now)
        _note_refused_gpus(node, refused)
        return _reconcile(node, running)


def agent_heartbeat(
    *, node: Node, running: Iterable[Sequence[Any]] = (), now: datetime | None = None
) -> list[tuple[int, int]]:
    """The node is alive and runs `running` ([job_id, attempt, pid] each); returns the
    attempts the agent is told to stop."""
    now = now or timezone.now()
    running = list(running)
    with transaction.atomic():
        _node_seen(node, now)
        stops = _reconcile(node, running)
        gpu_release_reconcile(node=node, running=[(int(r[0]), int(r[1])) for r in running])
    _lose_missing(node, {(int(r[0]), int(r[1])) for r in running}, now)
    return stops


def _lose_missing(node: Node, listed: set[tuple[int, int]], now: datetime) -> None:
    """A job the database runs on this node but the agent no longer lists has ended
    without its report arriving (the report was lost, or the agent lost its state). Once it
    has been missing for the grace period, it is lost and requeued like a job of a node
    that went down. The grace covers a final report still in flight."""
    grace = missing_grace_s()
    missing = [
        (row["id"], row["attempt"])
        for row in Job.objects.filter(node=node, state=JobState.RUNNING).values("id", "attempt")
        if (row["id"], row["attempt"]) not in listed
    ]
    for job_id, attempt in missing:
        marker = f"agents:missing:{job_id}.{attempt}"
        try:
            since = cache.get(marker)
            if since is None:
                cache.set(marker, now.timestamp(), timeout=int(grace * 3) + 1)
                continue
        except Exception:
            return  # no cache, no memory of earlier heartbeats: decide later
        if now.timestamp() - since < grace:
            continue
        try:
            with transaction.atomic():
                job = Job.objects.get(pk=job_id)
                if job.attempt == attempt:
                    _requeue_lost(
                        job, f"node {node.name} no longer runs it; its end was not reported"
                    )
        except (Conflict, Job.DoesNotExist):
            continue
        messaging.request_schedule()


def _reconcile(node: Node, running: Iterable[Sequence[Any]]) -> list[tuple[int, int]]:
    pids = {(int(r[0]), int(r[1])): (int(r[2]) if len(r) > 2 and r[2] else None) for r in running}
    if not pids:
        return []
    active = {
        (row["id"], row["attempt"]): row["state"]
        for row in Job.objects.filter(
            id__in={job_id for job_id, _ in pids}, node=node, state__in=ACTIVE_STATES
        ).values("id", "attempt", "state")
    }
    stops = sorted(key for key in pids if key not in active)
    for key, state in active.items():
        if key in pids and state == JobState.ASSIGNED:
            job_report_apply(
                node=node, job_id=key[0], attempt=key[1], state="running", pid=pids[key]
            )
    if stops:
        log.info("node %s runs attempts it is no longer assigned: %s", node.name, stops)
        messaging.send_to_node_on_commit(
            node.name,
            RECONCILE_TASK,
            stop=[list(k) for k in stops],
            reason="the control side no longer assigns this attempt to this node",
        )
    return stops


# -- job reports ----------------------------------------------------------------------------

# Supervisor state -> transitions to apply, in order. A report that skips "running" (its
# running report was lost or arrives later) applies the start first, so the job still
# passes through running; the later running report is then recorded as ignored.
# "cancelled" for an attempt the database still runs means the node stopped it on its own:
# it ends as failed, so the job never stays running on a node that no longer runs it.
REPORT_ACTIONS: dict[str, tuple[str, ...]] = {
    "running": ("start",),
    "succeeded": ("start", "succeed"),
    "failed": ("fail",),
    "timeout": ("start", "time_out"),
    "preempted": ("preempt",),
    "cancelled": ("fail",),
}


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
    actions = REPORT_ACTIONS.get(state)
    if actions is None:
        log.warning("node %s reported unknown state %r for job %s", node.name, state, job_id)
        return False
    if state != "running":
        # Whatever else this report means, the attempt's process is gone.
        gpu_release_done(job_id=job_id, attempt=attempt)
    current = Job.objects.filter(id=job_id).values("state", "attempt", "node_id").first()
    why = ""
    if current is None:
        log.info("node %s reported %s for unknown job %s", node.name, state, job_id)
        return False
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
    if state == "cancelled":
        reason = f"stopped on node {node.name}: {reason or 'cancelled'}"
    applied = False
    job: Job | None = None
    with transaction.atomic():
        for action in actions:
            if action == "start" and current["state"] != JobState.ASSIGNED:
                continue
            fields: dict[str, Any] = {}
            if action == "start":
                fields = {"pid": pid} if pid else {}
                text = "" if state == "running" else "running (its start report came later)"
            else:
                fields = {"exit_code": 0 if action == "succeed" else exit_code}
                text = reason
            try:
                job = job_transition(
                    job_id=job_id,
                    action=action,
                    actor=actor,
                    reason=text,
                    attempt=attempt,
                    fields=fields,
                )
            except Conflict as exc:
                job_record_ignored(
                    job_id=job_id, action=state, actor=actor, attempt=attempt, why=exc.message
                )
                return applied
            applied = True
    if job is not None and job.state != JobState.RUNNING:
        messaging.request_schedule()
    return applied


# -- the reaper -----------------------------------------------------------------------------


def _requeue_lost(job: Job, reason: str) -> None:
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


def nodes_reap(*, now: datetime | None = None) -> dict[str, int]:
    """One reaper round; returns how many nodes went down, jobs were lost, and starts were
    given up on."""
    now = now or timezone.now()
    down = 0
    for node in Node.objects.exclude(state=NodeState.DOWN):
        deadline = now - timedelta(seconds=node.heartbeat_timeout)
        if node.last_heartbeat is not None and node.last_heartbeat >= deadline:
            continue
        since = (
            f"since {node.last_heartbeat:%Y-%m-%d %H:%M:%S} UTC" if node.last_heartbeat else "ever"
        )
        down += Node.objects.filter(
            pk=node.pk, state=node.state, last_heartbeat=node.last_heartbeat
        ).update(state=NodeState.DOWN, state_reason=f"no heartbeat {since}")
        log.warning("node %s is down: no heartbeat %s", node.name, since)

    lost = 0
    on_down_nodes = Job.objects.filter(node__state=NodeState.DOWN, state__in=ACTIVE_STATES)
    for job in on_down_nodes.select_related("node").only("id", "attempt", "node__name"):
        assert job.node is not None
        try:
            with transaction.atomic():
                _requeue_lost(job, f"node {job.node.name} went down")
            lost += 1
        except Conflict:
            continue  # its state changed meanwhile (a report arrived): nothing to do

    unconfirmed = 0
    timeout = start_timeout_s()
    stuck = Job.objects.filter(
        state=JobState.ASSIGNED,
        assigned_at__lt=now - timedelta(seconds=timeout),
        node__state__in=[NodeState.UP, NodeState.DRAINING],
    ).only("id", "attempt")
    for job in stuck:
        reason = f"the node did not confirm the start within {timeout:g} s"
        try:
            with transaction.atomic():
                back = job_transition(
                    job_id=job.pk,
                    action="undispatch",
                    actor=SYSTEM,
                    reason=reason,
                    attempt=job.attempt,
                )
                stop_previous_attempt(back, reason)
            unconfirmed += 1
        except Conflict:
            continue
    released = gpu_release_prune(now=now)
    if down or lost or unconfirmed or released:
        messaging.request_schedule()
    return {"nodes_down": down, "jobs_lost": lost, "starts_given_up": unconfirmed}
