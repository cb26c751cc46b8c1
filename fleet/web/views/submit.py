"""The submit page: the job form, validated by the same service as the API, and a live
what-if line from the estimate endpoint when it exists."""

from __future__ import annotations

from typing import cast

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from fleet.errors import ApplicationError
from fleet.models import Gpu, Membership
from fleet.services.jobs import job_submit
from fleet.web import sources
from fleet.web.access import member_required
from fleet.web.forms import JobForm


@member_required
def submit_page(request: HttpRequest) -> HttpResponse:
    memberships = list(
        Membership.objects.filter(user_id=cast(int, request.user.pk)).select_related("team")
    )
    teams = [(m.team.slug, m.team.name) for m in memberships]
    default = next((m.team.slug for m in memberships if m.is_default), None)
    if request.method == "POST":
        form = JobForm(request.POST, teams=teams)
        if form.is_valid():
            try:
                job = job_submit(user=request.user, request=form.to_request())
            except ApplicationError as error:
                fields = error.extra.get("fields", {})
                for name, errors in fields.items():
                    for message in errors:
                        form.add_error(name if name in form.fields else None, message)
                if not fields:
                    form.add_error(None, error.message)
            else:
                messages.success(request, f"Job {job.pk} submitted.")
                return redirect("job", job_id=job.pk)
    else:
        form = JobForm(teams=teams, initial={"team": default})
    models = sorted(set(Gpu.objects.values_list("model", flat=True)))
    return render(
        request,
        "web/submit.html",
        {
            "form": form,
            "gpu_models": models,
            "estimate_url": sources.api_url("job-estimate"),
        },
    )
