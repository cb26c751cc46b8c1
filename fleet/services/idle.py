"""Idle GPUs: running jobs whose GPUs stayed under their team's utilization threshold.

The periodic tick (fleet/tasks.py `notify_tick`) looks at each running job of a team with
`idle_minutes` > 0 that has run at least that long. The job is idle when the stored
telemetry of every GPU it holds (raw samples and one-minute rollups, on every node of a
multi-node job) covers the whole window and never reaches `idle_util_percent`. Missing
telemetry is never taken for idleness: a window with no reading near its start or its end
is left alone. An idle attempt is marked once (JobIdle), its owner notified, and, where the
team chose `idle_action="stop"`, the job is cancelled through the state machine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Exists, Max, Min, OuterRef, Q

from fleet.errors import Conflict
from fleet.models import (
    Gpu,
    Job,
    JobIdle,
    JobMember,
    JobState,
    NotificationEvent,
    TelemetryRollup,
    TelemetrySample,
)
from fleet.services import messaging
from fleet.services.job_states import SYSTEM, job_transition
from fleet.services.jobs import stop_previous_attempt
from fleet.services.notifications import notify_job_event

log = logging.getLogger(__name__)

# How far from the window's ends the first and last readings may be (agents sample every
# few seconds; rollups are per minute).
MAX_GAP = timedelta(minutes=3)


@dataclass(frozen=True)
class IdleReading:
    max_util: float | None  # None: no reading at all
    first: datetime | None
    last: datetime | None


def _job_gpus(job: Job) -> list[int]:
    """Ids of the GPUs the job's current attempt holds, on every node."""
    places = list(
        JobMember.objects.filter(job_id=job.pk, attempt=job.attempt).values_list(
            "node_id", "gpu_indices"
        )
    )
    if not places and job.node_id:
        places = [(job.node_id, job.gpu_indices)]
    q = Q(pk__in=[])
    for node_id, indices in places:
        if node_id and indices:
            q |= Q(node_id=node_id, index__in=list(indices))
    return list(Gpu.objects.filter(q).values_list("id", flat=True))


def gpu_reading(*, gpu_ids: list[int], since: datetime, until: datetime) -> IdleReading:
    """Highest utilization and the first and last reading times of these GPUs in
    [since, until], over raw samples and rollups together."""
    raw = TelemetrySample.objects.filter(
        gpu_id__in=gpu_ids, sampled_at__gte=since, sampled_at__lte=until
    ).aggregate(m=Max("util_percent"), first=Min("sampled_at"), last=Max("sampled_at"))
    rolled = TelemetryRollup.objects.filter(
        gpu_id__in=gpu_ids, minute__gte=since, minute__lte=until
    ).aggregate(m=Max("util_percent_max"), first=Min("minute"), last=Max("minute"))
    maxima = [v for v in (raw["m"], rolled["m"]) if v is not None]
    firsts = [v for v in (raw["first"], rolled["first"]) if v is not None]
    lasts = [v for v in (raw["last"], rolled["last"]) if v is not None]
    return IdleReading(
        max_util=max(maxima) if maxima else None,
        first=min(firsts) if firsts else None,
        last=max(lasts) if lasts else None,
    )


def job_is_idle(*, job: Job, now: datetime) -> IdleReading | None:
    """The reading that shows the job idle over its team's window, or None."""
    minutes = job.team.idle_minutes
    if not minutes or job.started_at is None:
        return None
    since = now - timedelta(minutes=minutes)
    if job.started_at > since:
        return None
    gpu_ids = _job_gpus(job)
    if not gpu_ids:
        return None
    reading = gpu_reading(gpu_ids=gpu_ids, since=since, until=now)
    gap = min(MAX_GAP, timedelta(minutes=minutes) / 2)
    if reading.max_util is None or reading.first is None or reading.last is None:
        return None
    if reading.first > since + gap or reading.last < now - gap:
        return None
    if reading.max_util >= job.team.idle_util_percent:
        return None
    return reading


def idle_check(*, now: datetime) -> dict[str, int]:
    """Mark, notify and (where the team says so) stop idle running jobs. Idempotent: an
    attempt is marked once."""
    flagged = stopped = 0
    marked = JobIdle.objects.filter(job_id=OuterRef("pk"), attempt=OuterRef("attempt"))
    jobs = (
        Job.objects.select_related("team")
        .filter(state=JobState.RUNNING, team__idle_minutes__gt=0)
        .exclude(Exists(marked))
    )
    for job in jobs:
        reading = job_is_idle(job=job, now=now)
        if reading is None:
            continue
        team = job.team
        detail = (
            f"its GPUs stayed under {team.idle_util_percent:g}% for {team.idle_minutes} min "
            f"(at most {reading.max_util:g}%)"
        )
        stop = team.idle_action == "stop"
        try:
            with transaction.atomic():
                mark = JobIdle.objects.create(
                    job=job,
                    attempt=job.attempt,
                    detected_at=now,
                    max_util_percent=reading.max_util or 0.0,
                    minutes=team.idle_minutes,
                )
                if stop:
                    reason = f"cancelled: {detail} (team {team.slug} stops idle jobs)"
                    cancelled = job_transition(
                        job_id=job.pk,
                        action="cancel",
                        actor=SYSTEM,
                        reason=reason,
                        attempt=job.attempt,
                    )
                    stop_previous_attempt(cancelled, reason=reason)
                    messaging.request_schedule()
                    mark.stopped = True
                    mark.save(update_fields=["stopped"])
        except IntegrityError:
            continue  # another tick marked it first
        except Conflict as e:
            log.info("idle job %s changed before it could be stopped: %s", job.pk, e)
            continue
        flagged += 1
        stopped += int(stop)
        suffix = "; fleet cancelled it" if stop else ""
        notify_job_event(
            job_id=job.pk, attempt=job.attempt, event=NotificationEvent.IDLE, detail=detail + suffix
        )
    return {"idle_flagged": flagged, "idle_stopped": stopped}
