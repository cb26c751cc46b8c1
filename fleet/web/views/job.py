"""The job page: details, the state timeline from its events (live), the members of a
multi-node job (rank, node, GPUs, state), its log tail with one log per rank, charts of its
GPUs over its life, and the actions its owner, team admins and staff may take."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from fleet.errors import ApplicationError, NotFound
from fleet.models import Job, JobEvent, JobState
from fleet.selectors.jobs import job_events, job_get, job_reason_shown, job_state_reason
from fleet.services import jobs as job_services
from fleet.services.access import can_manage_job, can_see_command
from fleet.web import live, sources
from fleet.web.access import member_required
from scheduler.cycle.eta_learning import band_for, current_calibration
from scheduler.cycle.queue_order import queue_waits

# Which buttons make sense in which state (the state machine has the final word).
ACTIONS: dict[str, tuple[str, ...]] = {
    "cancel": (JobState.PENDING, JobState.HELD, JobState.ASSIGNED, JobState.RUNNING),
    "hold": (JobState.PENDING,),
    "release": (JobState.HELD,),
    "requeue": (
        JobState.ASSIGNED,
        JobState.RUNNING,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.LOST,
    ),
}


def _get(request: HttpRequest, job_id: int) -> Job:
    try:
        return job_get(job_id=job_id, fetched_by=request.user)
    except NotFound as error:
        raise Http404(error.message)


def timeline(job: Job, events: list[JobEvent], now: datetime) -> list[dict[str, Any]]:
    """Applied events in order, each with how long the job stayed in the state it entered."""
    applied = [e for e in events if e.applied]
    rows: list[dict[str, Any]] = []
    for i, event in enumerate(applied):
        end = applied[i + 1].at if i + 1 < len(applied) else (None if job.is_final else now)
        seconds = (end - event.at).total_seconds() if end else None
        rows.append({"event": event, "seconds": seconds, "current": i == len(applied) - 1})
    total = sum(r["seconds"] or 0 for r in rows) or 1
    for row in rows:
        row["share"] = max(1.0, 100 * (row["seconds"] or 0) / total) if row["seconds"] else 0
    return rows


def job_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    events = list(job_events(job=job))
    for event in events:
        event.reason = job_reason_shown(job=job, reason=event.reason, fetched_by=request.user)
    manage = can_manage_job(request.user, job)
    band = None
    if job.state == "pending" and job.eta is not None:
        band = band_for(job.eta, timezone.now(), current_calibration())
    waits = queue_waits() if job.state == "pending" else None
    return {
        "job": job,
        "queue_position": None if waits is None else waits.position(job.pk),
        "eta_band": band,
        "reason": job_state_reason(job=job, fetched_by=request.user, waits=waits),
        "events": events,
        "ignored": [e for e in events if not e.applied],
        "timeline": timeline(job, events, timezone.now()),
        # The current attempt's members, rank 0 first (job_get prefetches them).
        "members": sorted(
            (m for m in job.members.all() if m.attempt == job.attempt), key=lambda m: m.rank
        ),
        "can_manage": manage,
        "actions": [a for a, states in ACTIONS.items() if job.state in states] if manage else [],
        "poll": live.POLL_SECONDS,
    }


@member_required
def job_page(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _get(request, job_id)
    context = job_context(request, job)
    if live.is_partial(request):
        return render(request, "partials/job_live.html", context)
    manage = context["can_manage"]
    context.update(
        {
            "show_command": can_see_command(request.user, job),
            "logs_url": sources.api_url("job-logs", job_id=job.pk) if manage else None,
            # One log per member: rank 0 for a single-node job.
            "log_ranks": [m.rank for m in context["members"]] or [0],
        }
    )
    return render(request, "web/job.html", context)


@require_POST
@member_required
def job_action(request: HttpRequest, job_id: int, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404("No such action.")
    job = _get(request, job_id)
    act = getattr(job_services, f"job_{action}")
    try:
        act(user=request.user, job=job, reason=request.POST.get("reason", "")[:500])
    except ApplicationError as error:
        messages.error(request, error.message)
        status = getattr(error, "status_code", 400)
        if status == 403:
            return render(request, "web/forbidden.html", {"message": error.message}, status=403)
    else:
        messages.success(request, f"Job {job.pk}: {job_services.PAST[action]}.")
    return redirect("job", job_id=job.pk)
