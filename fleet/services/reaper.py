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
- Silence is only counted while the control side could hear (`Hearing`): after a stretch
  in which the reaper did not run (PostgreSQL or Redis down, every control worker gone), the
  length of that stretch is not held against a node or an unconfirmed start. Otherwise a
  job that finished during a PostgreSQL outage would be declared lost (and run again)
  before its agent's outcome, held until acknowledged (design rule 8), could be applied.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Min
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


HEARING_KEY = "reaper:hearing"


class Hearing:
    """When the control side last went deaf and came back, kept in the cache by the reaper.

    Each round the reaper notes when it ran. A round that finds the previous one older than
    the shortest heartbeat timeout of any node knows the control side heard nothing in
    between (nothing ran that could apply a heartbeat or a report), and remembers that gap
    (`deaf_from` to `since`). A moment before the gap is then read as that much later, and
    one inside it as the gap's end (`shifted`), so a node's silence and a start's wait count
    only time when the control side was surely listening. With no record (the first round, or Redis lost its data) nothing is
    known of the past: every moment before this round counts as this round's."""

    def __init__(self, deaf_from: float | None, since: float) -> None:
        self.deaf_from = deaf_from
        self.since = since

    def shifted(self, moment: datetime) -> datetime:
        at = moment.timestamp()
        if at >= self.since:
            return moment
        if self.deaf_from is None:
            return datetime.fromtimestamp(self.since, tz=moment.tzinfo)
        # Heard inside the gap: the control side listened then, but may have gone deaf any
        # moment after (a database outage that began just after a heartbeat was applied), so
        # the node's silence counts from the gap's end. Counting it from the heartbeat would
        # declare nodes lost, and requeue jobs that ended during the outage, for silence
        # nobody could hear.
        return moment + timedelta(seconds=self.since - max(at, self.deaf_from))


def hearing_update(*, now: datetime, max_gap_s: float) -> Hearing:
    """Record this round and return the latest gap in the control side's hearing."""
    at = now.timestamp()
    try:
        record = cache.get(HEARING_KEY)
    except Exception:
        record = None  # no cache: the round itself will fail on the broker soon enough
    if not isinstance(record, dict) or "last" not in record:
        record = {"deaf_from": None, "since": at, "last": at}
    elif at - float(record["last"]) > max_gap_s:
        record = {"deaf_from": float(record["last"]), "since": at, "last": at}
        log.warning(
            "the reaper did not run for %.0f s: node silence and start waits in that time "
            "are not counted", at - record["deaf_from"],
        )  # fmt: skip
    else:
        record = {**record, "last": max(at, float(record["last"]))}
    try:
        cache.set(HEARING_KEY, record, timeout=None)
    except Exception:
        pass
    return Hearing(record["deaf_from"], float(record["since"]))


def nodes_reap(*, now: datetime | None = None) -> dict[str, int]:
    """One reaper round; returns how many nodes went down, jobs were lost, starts were sent
    again and starts were given up on."""
    now = now or timezone.now()
    shortest = Node.objects.aggregate(t=Min("heartbeat_timeout"))["t"]
    hearing = hearing_update(now=now, max_gap_s=float(shortest or 30))
    summary = {
        "nodes_down": _silent_nodes_down(now, hearing),
        "jobs_lost": _lose_jobs_of_expired_leases(now, hearing),
        "starts_resent": _resend_unconfirmed_starts(now),
        "starts_given_up": _give_up_unconfirmed_starts(now, hearing),
    }
    released = gpu_release_prune(now=now)
    if summary["nodes_down"] or summary["jobs_lost"] or summary["starts_given_up"] or released:
        messaging.request_schedule()
    return summary


def _silent_nodes_down(now: datetime, hearing: Hearing) -> int:
    down = 0
    for node in Node.objects.exclude(state=NodeState.DOWN):
        deadline = now - timedelta(seconds=node.heartbeat_timeout)
        if node.last_heartbeat is not None and hearing.shifted(node.last_heartbeat) >= deadline:
            continue
        since = (
            f"since {node.last_heartbeat:%Y-%m-%d %H:%M:%S} UTC" if node.last_heartbeat else "ever"
        )
        down += Node.objects.filter(
            pk=node.pk, state=node.state, last_heartbeat=node.last_heartbeat
        ).update(state=NodeState.DOWN, state_reason=f"no heartbeat {since}")
        log.warning("node %s is down: no heartbeat %s", node.name, since)
    return down


def _lose_jobs_of_expired_leases(now: datetime, hearing: Hearing) -> int:
    lost = 0
    for node in Node.objects.filter(state=NodeState.DOWN):
        heard = node.last_heartbeat
        if heard is not None and now < hearing.shifted(heard) + lost_after(node):
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


def _give_up_unconfirmed_starts(now: datetime, hearing: Hearing) -> int:
    given_up = 0
    timeout = start_timeout_s()
    stuck = Job.objects.filter(
        state=JobState.ASSIGNED,
        assigned_at__lt=now - timedelta(seconds=timeout),
        node__state__in=[NodeState.UP, NodeState.DRAINING],
    ).only("id", "attempt", "assigned_at")
    for job in stuck:
        if job.assigned_at and hearing.shifted(job.assigned_at) >= now - timedelta(seconds=timeout):
            continue  # its start report may be among what the control side could not hear
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
