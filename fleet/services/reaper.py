"""The reaper (a beat entry, every few seconds): what the control side does when nodes fall
silent or starts go unconfirmed (design rules 1 and 7).

- A node whose heartbeat is older than its `heartbeat_timeout` goes down: it gets no new
  work. Its jobs are declared lost only once its agent's lease has surely run out (last
  heartbeat + lease + the job grace + `FLEET_LEASE_MARGIN_S`): by then the agent, or each
  job's shim if the agent is dead or frozen, has stopped them, so a requeued job never runs
  on two nodes at once. Until then the jobs stay where they are, holding their GPUs.
- A start not confirmed after `FLEET_START_RESEND` seconds is sent again (the first may
  have been lost with a control worker killed between commit and send; the agent starts an
  attempt once, however often it is asked); after `FLEET_START_TIMEOUT` the job goes back
  to the queue and its start is fenced. A multi-node job waits for every member: a start
  is sent again to each member not yet started, and one member that does not start in
  time sends the whole job back, every member stopped.
- A multi-node job with a member on a node whose lease ran out is lost whole: its members
  on other nodes are stopped there.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from fleet.errors import Conflict
from fleet.models import Job, JobState, Node, NodeState
from fleet.models.jobs import ACTIVE_STATES
from fleet.services import messaging
from fleet.services.job_reports import requeue_lost
from fleet.services.job_states import SYSTEM, job_transition
from fleet.services.jobs import stop_previous_attempt
from fleet.services.members import on_node
from fleet.services.releases import gpu_release_prune

log = logging.getLogger(__name__)


def _setting(name: str, default: float) -> float:
    value = getattr(settings, name, None)
    return float(value if value is not None else os.environ.get(name, default))


def start_timeout_s() -> float:
    """How long an assigned job may wait for its node to confirm the start."""
    return _setting("FLEET_START_TIMEOUT", 120)


def missing_grace_s() -> float:
    """How long a running job may be missing from its node's heartbeats before it is lost."""
    return _setting("FLEET_MISSING_GRACE", 30)


def start_resend_s() -> float:
    """How long before an unconfirmed start is sent again."""
    return _setting("FLEET_START_RESEND", 10)


def lease_margin_s() -> float:
    """Added to a node's lease and the job grace before its jobs are declared lost: clock
    drift, and the time the stopped jobs' reports take."""
    return _setting("FLEET_LEASE_MARGIN_S", 15)


def lost_after(node: Node) -> timedelta:
    """How long after a node's last heartbeat its jobs are surely stopped."""
    seconds = node.lease_seconds + float(settings.FLEET_JOB_GRACE) + lease_margin_s()
    return timedelta(seconds=max(seconds, node.heartbeat_timeout))


def nodes_reap(*, now: datetime | None = None) -> dict[str, int]:
    """One reaper round; returns how many nodes went down, jobs were lost, starts were sent
    again and starts were given up on."""
    now = now or timezone.now()
    summary = {
        "nodes_down": _silent_nodes_down(now),
        "jobs_lost": _lose_jobs_of_expired_leases(now),
        "starts_resent": _resend_unconfirmed_starts(now),
        "starts_given_up": _give_up_unconfirmed_starts(now),
    }
    released = gpu_release_prune(now=now)
    if summary["nodes_down"] or summary["jobs_lost"] or summary["starts_given_up"] or released:
        messaging.request_schedule()
    return summary


def _silent_nodes_down(now: datetime) -> int:
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
    return down


def _lose_jobs_of_expired_leases(now: datetime) -> int:
    lost = 0
    for node in Node.objects.filter(state=NodeState.DOWN):
        if node.last_heartbeat is not None and now < node.last_heartbeat + lost_after(node):
            continue  # its jobs may still run until its lease is surely over
        # Every job with a member there: a multi-node job is lost whole, its other members
        # stopped on their nodes.
        jobs = (
            Job.objects.filter(on_node(node), state__in=ACTIVE_STATES)
            .distinct()
            .only("id", "attempt", "gpus", "gpus_per_node", "cpus", "memory_mb")
        )
        for job in jobs:
            try:
                with transaction.atomic():
                    requeue_lost(job, f"node {node.name} went down", node_id=node.pk)
                lost += 1
            except Conflict:
                continue  # its state changed meanwhile (a report arrived): nothing to do
    return lost


def _resend_unconfirmed_starts(now: datetime) -> int:
    from fleet.services.dispatch import send_start_on_commit

    every = start_resend_s()
    waiting = Job.objects.filter(
        state=JobState.ASSIGNED,
        assigned_at__lt=now - timedelta(seconds=every),
        assigned_at__gte=now - timedelta(seconds=start_timeout_s()),
        node__state__in=[NodeState.UP, NodeState.DRAINING],
    ).select_related("node", "owner", "team")
    sent = 0
    for job in waiting:
        try:
            if not cache.add(
                f"reaper:resent:{job.pk}.{job.attempt}", 1, timeout=max(1, int(every))
            ):
                continue
        except Exception:
            pass  # no cache: sending again is harmless
        with transaction.atomic():
            send_start_on_commit(job, only_waiting=True)
        sent += 1
    return sent


def _give_up_unconfirmed_starts(now: datetime) -> int:
    given_up = 0
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
            given_up += 1
        except Conflict:
            continue
    return given_up
