"""The notifications page: where to send (webhook, email), which events, and what was sent."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from fleet.api.notifications import settings_data
from fleet.errors import ApplicationError
from fleet.models import NotificationEvent
from fleet.services.notifications import settings_update
from fleet.web.access import member_required

EVENT_LABELS = {
    "start": "Job started",
    "end": "Job succeeded",
    "failure": "Job failed, timed out or was lost",
    "time_limit": "Job reached 80% of its time limit",
    "requeue": "Job was preempted or requeued",
    "idle": "Job's GPUs stayed idle",
}


@member_required
def notifications_page(request: HttpRequest) -> HttpResponse:
    error, saved, status = "", False, 200
    if request.method == "POST":
        data: dict[str, Any] = {
            "webhook_url": request.POST.get("webhook_url", ""),
            "email": request.POST.get("email") == "on",
        }
        for event in NotificationEvent:
            data[f"on_{event.value}"] = request.POST.get(f"on_{event.value}") == "on"
        try:
            settings_update(user=request.user, data=data)
            saved = True
        except ApplicationError as e:
            error, status = e.message, 400
    current = settings_data(request.user)
    if error:
        # Show what was typed, so it can be corrected.
        current["webhook_url"] = request.POST.get("webhook_url", "")
    events = [(e, EVENT_LABELS[e], on) for e, on in current["events"].items()]
    context = {"prefs": current, "events": events, "error": error, "saved": saved}
    return render(request, "web/notifications.html", context, status=status)
