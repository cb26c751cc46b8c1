"""The queue page: pending jobs in the order the active policy will consider them, with
each one's position, why it waits and when it should start; and the running jobs."""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string

from fleet.models import Job, JobState
from fleet.models.jobs import ACTIVE_STATES
from fleet.selectors.jobs import job_list, job_reason_public
from fleet.services.access import team_ids
from fleet.web import live, sources
from fleet.web.access import member_required
from scheduler.cycle.queue_order import in_queue_order, queue_waits

PER_PAGE = 50
SCOPES = ("all", "team", "mine")


def scoped(jobs: QuerySet[Job], user: Any, scope: str) -> QuerySet[Job]:
    if scope == "mine":
        return jobs.filter(owner=user)
    if scope == "team":
        return jobs.filter(team_id__in=team_ids(user))
    return jobs


def queue_context(request: HttpRequest, scope: str) -> dict[str, Any]:
    jobs = scoped(job_list(fetched_by=request.user), request.user, scope)
    waiting = jobs.filter(state=JobState.PENDING)
    # The order the last cycle stored; jobs it has not seen yet follow, oldest first.
    waits = queue_waits()
    ordered = in_queue_order(waiting.values_list("id", "submitted_at"), waits)
    pending = Paginator(ordered, PER_PAGE).get_page(request.GET.get("page"))
    found = waiting.in_bulk([job_id for job_id, _ in pending])
    start = (pending.number - 1) * PER_PAGE
    rows = [
        (position or start + i + 1, found[job_id])
        for i, (job_id, position) in enumerate(pending)
        if job_id in found
    ]
    running = Paginator(
        jobs.filter(state__in=ACTIVE_STATES).order_by("started_at", "assigned_at", "id"),
        PER_PAGE,
    ).get_page(request.GET.get("rpage"))
    held = list(jobs.filter(state=JobState.HELD).order_by("submitted_at")[:PER_PAGE])
    # Rendered once for every viewer: reasons as anyone outside the job's team may see them.
    for job in [*(job for _, job in rows), *held]:
        reason = waits.reason(job.pk) if job.state == JobState.PENDING else None
        job.shown_reason = job_reason_public(  # type: ignore[attr-defined]
            job=job, reason=job.state_reason or "" if reason is None else reason
        )
    return {
        "scope": scope,
        "scopes": SCOPES,
        "pending": pending,
        "rows": rows,
        "running": running,
        "held": held,
        "policy": sources.active_policy_name(),
    }


@member_required
def queue_page(request: HttpRequest) -> HttpResponse:
    scope = request.GET.get("scope", "all")
    if scope not in SCOPES:
        scope = "all"
    key = "queue:" + request.GET.urlencode() + ("" if scope == "all" else f":u{request.user.pk}")
    html = live.shared_fragment(
        key,
        lambda: render_to_string(
            "partials/queue_tables.html", queue_context(request, scope), request=request
        ),
    )
    if live.is_partial(request):
        return HttpResponse(html)
    query = request.GET.urlencode()
    return render(
        request,
        "web/queue.html",
        {"tables": html, "scope": scope, "scopes": SCOPES, "query": query},
    )
