"""Scheduler settings (staff): the active policy, its parameters (weights among them) and
the tick interval, and how long recent scheduling cycles took. The rest is in the admin."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string

from fleet.errors import ApplicationError
from fleet.web import live, sources
from fleet.web.access import staff_required
from fleet.web.forms import SchedulerSettingsForm, policy_groups


def _cycles_figure(cycles: list[Any]) -> dict[str, Any]:
    x = [c.started_at.isoformat() for c in cycles]
    return {
        "duration": {
            "data": [
                {"type": "scatter", "mode": "lines+markers", "name": "cycle (ms)", "x": x,
                 "y": [round(c.duration_ms, 1) for c in cycles]},
            ],
            "layout": {"title": {"text": "Recent cycle durations (ms)"},
                       "yaxis": {"rangemode": "tozero"}},
        },
        "placed": {
            "data": [
                {"type": "bar", "name": "placed", "x": x, "y": [c.placed for c in cycles]},
                {"type": "bar", "name": "preempted", "x": x, "y": [c.preempted for c in cycles]},
            ],
            "layout": {"title": {"text": "Jobs placed and preempted per cycle"}},
        },
    }  # fmt: skip


def _recent_cycles() -> list[Any]:
    return (sources.recent_cycles() or [])[::-1][:20]


def _open_groups(form: SchedulerSettingsForm) -> set[str]:
    """Unfolded parameter groups: the shared ones, those of the policy shown in the picker
    (the one just submitted, if any), and any holding an error."""
    shown = str(form["policy"].value() or "")
    groups = {"shared", *policy_groups(shown)}
    groups.update(
        name for name, _, fields, _ in form.param_groups() if any(f.errors for f in fields)
    )
    return groups


@staff_required
def scheduler_page(request: HttpRequest) -> HttpResponse:
    row = sources.scheduler_settings()
    if live.is_partial(request):
        # "Recent cycles" polls this every 2 s while the tab is visible.
        html = live.shared_fragment(
            "scheduler-cycles",
            lambda: render_to_string(
                "partials/scheduler_cycles.html", {"cycles": _recent_cycles()}
            ),
        )
        return HttpResponse(html)
    if row is None:
        return render(request, "web/scheduler.html", {"row": None})
    from scheduler.cycle import config

    params_json = json.dumps(row.params or {}, indent=2, sort_keys=True)
    json_error = ""
    if request.method == "POST" and "params" in request.POST:
        # The advanced fallback: all parameters as one JSON object, as the API takes them.
        form = SchedulerSettingsForm(row=row)
        params_json = request.POST["params"].strip() or "{}"
        tick_text = request.POST.get("tick_seconds", "").strip()
        try:
            config.settings_update(
                user=request.user,
                policy=request.POST.get("policy") or None,
                params=json.loads(params_json),
                tick_seconds=int(tick_text) if tick_text.isdigit() else None,
            )
        except json.JSONDecodeError as error:
            json_error = f"Parameters are not valid JSON: {error.msg} (line {error.lineno})."
        except ApplicationError as error:
            json_error = error.message
        else:
            messages.success(request, "Scheduler settings saved; the next cycle uses them.")
            return redirect("scheduler")
    else:
        form = SchedulerSettingsForm(request.POST or None, row=row)
    if request.method == "POST" and not json_error and form.is_valid():
        data = form.cleaned_data
        current = row.updated_at.isoformat() if row.updated_at else ""
        if data["loaded"] and data["loaded"] != current:
            who = row.updated_by or "someone"
            form.add_error(
                None,
                f"{who} changed the settings at {row.updated_at:%H:%M:%S} UTC after this page was "
                "loaded. Reload the page to see their values, then make your change again.",
            )
    if request.method == "POST" and not json_error and form.is_valid():
        data = form.cleaned_data
        try:
            config.settings_update(
                user=request.user,
                policy=data["policy"],
                params=data["params"],
                tick_seconds=data["tick_seconds"],
            )
        except ApplicationError as error:
            form.add_error(None, error.message)
        else:
            messages.success(request, "Scheduler settings saved; the next cycle uses them.")
            return redirect("scheduler")
    status = 400 if json_error or (form.is_bound and form.errors) else 200
    return render(
        request,
        "web/scheduler.html",
        {
            "row": row,
            "form": form,
            "open_groups": _open_groups(form),
            "params_json": params_json,
            "json_error": json_error,
            "cycles": _recent_cycles(),
        },
        status=status,
    )


@staff_required
def scheduler_cycles_json(request: HttpRequest) -> JsonResponse:
    cycles = sources.recent_cycles()
    if not cycles:
        return JsonResponse({"available": False, "message": "No scheduling cycle recorded yet."})
    return JsonResponse({"available": True, "figures": _cycles_figure(cycles)})
