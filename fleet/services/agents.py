"""What agents tell the control side when they start and while they live.

Every message from an agent is signed with its node's key and checked against the node's
public key before any of this runs (fleet.services.wire, fleet.tasks). Then:

- `agent_register` (agent start): GPU inventory, backend, version, lease, the attempts the
  agent still runs and the outcomes it has not had acknowledged; the node comes back up.
- `agent_heartbeat` (every few seconds): the same lists. Both apply the outcomes
  (fleet.services.job_reports; design rule 8) and reconcile (rule 7): attempts the
  database no longer assigns to that node are sent back to stop, and their GPUs stay held
  until the agent no longer lists them; an assigned attempt the agent runs is confirmed as
  started (its start report was lost). Both are answered with an acknowledgement that
  renews the agent's lease and lets it forget the outcomes applied.

The inventory and host values a registration carries are checked in
fleet.services.agent_inventory, job reports in fleet.services.job_reports, the reaper in
fleet.services.reaper.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from fleet.errors import Conflict
from fleet.models import Job, JobMember, JobState, MemberState, Node, NodeState
from fleet.models.jobs import ACTIVE_STATES
from fleet.services import messaging
from fleet.services.agent_inventory import gpu_inventory_sync, host_check, refused_gpus_note
from fleet.services.job_reports import job_report_apply, requeue_lost
from fleet.services.reaper import missing_grace_s
from fleet.services.releases import gpu_release_hold_running, gpu_release_reconcile
from scheduler.cycle.admission import SHAPE_FIELDS, fleet_shape_changed
from workers.wire import key_generate, public_key_of

log = logging.getLogger(__name__)

# Sent to an agent with the attempts it runs that the database no longer assigns to it.
RECONCILE_TASK = "workers.tasks.reconcile"
# Sent to an agent for each heartbeat or registration applied (workers/lease.py).
ACKNOWLEDGE_TASK = "workers.tasks.acknowledge"
# How far an agent's clock may be behind the control side's before its heartbeats look late.
CLOCK_ALLOWANCE_S = 10.0


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
    host: Any = None,
    running: Iterable[Sequence[Any]] = (),
    outcomes: Iterable[dict[str, Any]] = (),
    at: float | None = None,
    lease: float | None = None,
    now: datetime | None = None,
) -> list[tuple[int, int]]:
    """Record the node's inventory (idempotent), apply its outcomes and reconcile; returns
    the attempts the agent is told to stop. `host` is what the agent offers jobs of its
    host (CPU cores, memory, its address for peers, its topology group, how it confines
    jobs); an agent that does not send it leaves those fields as they were."""
    now = now or timezone.now()
    host_fields, host_refused = host_check(host)
    for why in host_refused:
        log.warning("node %s registered a host value that was refused: %s", node.name, why)
    with transaction.atomic():
        # A write first: SQLite then takes its write lock at once (waiting for it) instead
        # of failing when a read transaction tries to upgrade.
        shape = {k: v for k, v in host_fields.items() if k in SHAPE_FIELDS}
        if shape and Node.objects.filter(pk=node.pk).exclude(**shape).exists():
            fleet_shape_changed()
        Node.objects.filter(pk=node.pk).update(
            gpu_backend=backend[:20], agent_version=agent_version[:50], **host_fields
        )
        refused = gpu_inventory_sync(node, gpus)
    stops = _agent_alive(node, running, outcomes, at, lease, now)
    # After the node is seen: coming back up clears its state_reason.
    refused_gpus_note(node, refused)
    return stops


def agent_heartbeat(
    *,
    node: Node,
    running: Iterable[Sequence[Any]] = (),
    outcomes: Iterable[dict[str, Any]] = (),
    at: float | None = None,
    lease: float | None = None,
    now: datetime | None = None,
) -> list[tuple[int, int]]:
    """The node is alive, runs `running` ([job_id, attempt, pid, gpu_indices] each) and
    reports `outcomes` (final supervisor events not yet acknowledged); returns the attempts
    the agent is told to stop."""
    return _agent_alive(node, running, outcomes, at, lease, now or timezone.now())


def _agent_alive(
    node: Node,
    running: Iterable[Sequence[Any]],
    outcomes: Iterable[dict[str, Any]],
    at: float | None,
    lease: float | None,
    now: datetime,
) -> list[tuple[int, int]]:
    running = [list(r) for r in running]
    listed = {(int(r[0]), int(r[1])) for r in running}
    applied = _apply_outcomes(node, outcomes)
    with transaction.atomic():
        if lease:
            Node.objects.filter(pk=node.pk).update(lease_seconds=max(1, int(lease)))
        # A heartbeat delivered long after it was sent (retried through a database outage,
        # held up in the broker) proves nothing about the node now, and what it lists is old.
        late = at is not None and now.timestamp() - at > node.heartbeat_timeout + CLOCK_ALLOWANCE_S
        if not late:
            _node_seen(node, now)
        current = not late and _is_newest(node, at)
        stops = _reconcile(node, running) if current else []
        if current:
            gpu_release_reconcile(node=node, running=listed)
        if at is not None:
            messaging.send_to_node_on_commit(
                node.name,
                ACKNOWLEDGE_TASK,
                ttl=float(lease or node.lease_seconds),
                heard_at=at,
                outcomes=[list(k) for k in applied],
            )
    if current:
        _lose_missing(node, listed, now)
    return stops


def _apply_outcomes(node: Node, outcomes: Iterable[dict[str, Any]]) -> list[tuple[Any, int]]:
    """Apply each repeated outcome (idempotent) and return those now settled, which the
    agent may forget. One that fails to apply is left for the next heartbeat."""
    settled = []
    for event in outcomes:
        try:
            key = (event["job_id"], int(event["attempt"]))
            exit_code = event.get("exit_code")
            job_report_apply(
                node=node,
                job_id=int(key[0]),
                attempt=key[1],
                state=str(event["state"]),
                pid=event.get("pid"),
                exit_code=int(exit_code) if exit_code is not None else None,
                reason=str(event.get("reason") or ""),
                resumed=event.get("resumed"),  # checked value by value in job_report_apply
            )
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("node %s sent an unreadable outcome %r: %s", node.name, event, exc)
            continue
        settled.append(key)
    return settled


def _is_newest(node: Node, at: float | None) -> bool:
    """False for a heartbeat sent before one already applied (the broker reordered them):
    what it lists is out of date, so nothing is stopped or lost on its word."""
    if at is None:
        return True
    newer = Node.objects.filter(pk=node.pk).filter(
        Q(agent_clock__isnull=True) | Q(agent_clock__lte=at)
    )
    return newer.update(agent_clock=at) == 1


def _lose_missing(node: Node, listed: set[tuple[int, int]], now: datetime) -> None:
    """A job the database runs on this node but the agent neither runs nor has an outcome
    for (it lost its state) has ended unseen. Once it has been missing for the grace period
    across heartbeats, it is lost and requeued like a job of a node that went down. The
    grace covers a heartbeat sent before the job started; a job listed again is no longer
    missing."""
    grace = missing_grace_s()
    rows = set(
        Job.objects.filter(node=node, state=JobState.RUNNING).values_list(
            "id", "attempt", "assigned_at"
        )
    )
    # Members of multi-node jobs on this node that reported their start.
    rows |= set(
        JobMember.objects.filter(
            node=node,
            rank__gt=0,
            state=MemberState.RUNNING,
            job__state=JobState.RUNNING,
            attempt=F("job__attempt"),
        ).values_list("job_id", "attempt", "job__assigned_at")
    )
    try:
        cache.delete_many([f"agents:missing:{job_id}.{attempt}" for job_id, attempt in listed])
    except Exception:
        return  # no cache, no memory of earlier heartbeats: decide later
    for job_id, attempt, assigned_at in rows:
        if (job_id, attempt) in listed:
            continue
        marker = f"agents:missing:{job_id}.{attempt}"
        # The marker names the dispatch it was set for: one left by an earlier database
        # (restored from a backup, or made anew, where ids and attempts repeat) or by
        # anything but this very dispatch starts the grace over instead of cutting it short.
        dispatched = assigned_at.timestamp() if assigned_at is not None else None
        try:
            seen = cache.get(marker)
            if not (isinstance(seen, list) and len(seen) == 2 and seen[1] == dispatched):
                cache.set(marker, [now.timestamp(), dispatched], timeout=int(grace * 3) + 1)
                continue
        except Exception:
            return
        if now.timestamp() - seen[0] < grace:
            continue
        try:
            with transaction.atomic():
                job = Job.objects.get(pk=job_id)
                if job.attempt == attempt:
                    requeue_lost(
                        job,
                        f"node {node.name} no longer runs it; its end was not reported",
                        node_id=node.pk,
                    )
        except (Conflict, Job.DoesNotExist):
            continue
        messaging.request_schedule()


def _reconcile(node: Node, running: Sequence[Sequence[Any]]) -> list[tuple[int, int]]:
    pids = {(int(r[0]), int(r[1])): (int(r[2]) if len(r) > 2 and r[2] else None) for r in running}
    if not pids:
        return []
    active = {
        (row["id"], row["attempt"]): row["state"]
        for row in Job.objects.filter(
            id__in={job_id for job_id, _ in pids}, node=node, state__in=ACTIVE_STATES
        ).values("id", "attempt", "state")
    }
    # Members on this node (further members of multi-node jobs too): a member is assigned
    # while its own start is unconfirmed, whatever the job as a whole is.
    for job_id, attempt, member_state in JobMember.objects.filter(
        job_id__in={job_id for job_id, _ in pids},
        node=node,
        attempt=F("job__attempt"),
        job__state__in=ACTIVE_STATES,
    ).values_list("job_id", "attempt", "state"):
        live = member_state in (MemberState.ASSIGNED, MemberState.RUNNING)
        if live:
            active[(job_id, attempt)] = (
                JobState.ASSIGNED if member_state == MemberState.ASSIGNED else JobState.RUNNING
            )
    stops = sorted(key for key in pids if key not in active)
    gpus = {(int(r[0]), int(r[1])): r[3] for r in running if len(r) > 3 and r[3]}
    for key in stops:
        if key in gpus:
            # Its process still runs: its GPUs are not free until the agent stops listing it.
            gpu_release_hold_running(
                node=node, job_id=key[0], attempt=key[1], gpu_indices=gpus[key]
            )
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
