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

Job reports are in fleet.services.job_reports, the reaper in fleet.services.reaper.
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
from fleet.models import Gpu, Job, JobMember, JobState, MemberState, Node, NodeState
from fleet.models.jobs import ACTIVE_STATES
from fleet.services import messaging
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
    if stale:
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
            fleet_shape_changed()
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


# What a registration's `host` may say: an agent offers jobs at most this much of its host.
MAX_HOST_CPUS = 65_536
MAX_HOST_MEMORY_MB = 2**31 - 1  # 2 PiB; the column's limit
HOST_TEXT = {"address": 255, "group": 100, "enforcement": 300}


def host_check(host: Any) -> tuple[dict[str, Any], list[str]]:
    """The Node fields a registration's `host` sets, and why any value in it was refused.

    A value of the wrong type or out of range (negative cores, memory of 10**30 MB, a
    float, a boolean, an address of 5 kB) is refused alone and the node keeps what it had;
    the rest is stored."""
    if host is None:
        return {}, []
    if not isinstance(host, dict):
        return {}, [f"host must be an object, not {type(host).__name__}"]
    fields: dict[str, Any] = {}
    refused: list[str] = []
    for name, high in (("cpus", MAX_HOST_CPUS), ("memory_mb", MAX_HOST_MEMORY_MB)):
        if name not in host:
            continue
        value = host[name]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            refused.append(f"{name} {value!r} is not a whole number between 0 and {high}")
        else:
            fields[name] = value
    for name, size in HOST_TEXT.items():
        if name not in host:
            continue
        value = host[name]
        if not isinstance(value, str) or len(value) > size or not value.isprintable():
            refused.append(f"{name} must be printable text of at most {size} characters")
        else:
            fields["resource_enforcement" if name == "enforcement" else name] = value.strip()
    return fields, refused


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
        refused = _sync_gpus(node, gpus)
    stops = _agent_alive(node, running, outcomes, at, lease, now)
    # After the node is seen: coming back up clears its state_reason.
    _note_refused_gpus(node, refused)
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
