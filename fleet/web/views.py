"""Server-rendered dashboard pages."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from fleet.models import Job, Node
from fleet.models.jobs import ACTIVE_STATES, QUEUED_STATES


@login_required
def home(request: HttpRequest) -> HttpResponse:
    context = {
        "nodes": Node.objects.count(),
        "queued": Job.objects.filter(state__in=QUEUED_STATES).count(),
        "active": Job.objects.filter(state__in=ACTIVE_STATES).count(),
    }
    return render(request, "home.html", context)
