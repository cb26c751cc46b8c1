"""Scheduler settings (staff): the active policy, its weights and tick interval, and how
long recent scheduling cycles took. Everything else is in the Django admin."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from fleet.web import sources
from fleet.web.access import staff_required


@staff_required
def scheduler_page(request: HttpRequest) -> HttpResponse:
    state = sources.scheduler_state()
    return render(request, "web/scheduler.html", {"state": state})
