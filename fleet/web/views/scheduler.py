"""Scheduler settings (staff): the active policy, its parameters (weights among them) and
the tick interval, and how long recent scheduling cycles took. The rest is in the admin."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render

from fleet.errors import ApplicationError
from fleet.web import sources
from fleet.web.access import staff_required


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


@staff_required
def scheduler_page(request: HttpRequest) -> HttpResponse:
    row = sources.scheduler_settings()
    if row is None:
        return render(request, "web/scheduler.html", {"row": None})
    from scheduler.cycle import config
    from scheduler.policies import policy_names

    errors: list[str] = []
    params_text = json.dumps(row.params or {}, indent=2, sort_keys=True)
    if request.method == "POST":
        params_text = request.POST.get("params", "").strip() or "{}"
        try:
            params = json.loads(params_text)
        except json.JSONDecodeError as error:
            errors.append(f"Parameters are not valid JSON: {error.msg} (line {error.lineno}).")
        else:
            try:
                tick = int(request.POST.get("tick_seconds", ""))
            except ValueError:
                errors.append("The tick interval must be a whole number of seconds.")
            else:
                try:
                    config.settings_update(
                        user=request.user,
                        policy=request.POST.get("policy", row.policy),
                        params=params,
                        tick_seconds=tick,
                    )
                except ApplicationError as error:
                    errors.append(error.message)
                else:
                    messages.success(request, "Scheduler settings saved; the next cycle uses them.")
                    return redirect("scheduler")
    known = sorted(config.known_params().items())
    return render(
        request,
        "web/scheduler.html",
        {
            "row": row,
            "policies": policy_names(),
            "params_text": params_text,
            "known": known,
            "errors": errors,
            "cycles": (sources.recent_cycles() or [])[::-1][:20],
        },
    )


@staff_required
def scheduler_cycles_json(request: HttpRequest) -> JsonResponse:
    cycles = sources.recent_cycles()
    if not cycles:
        return JsonResponse({"available": False, "message": "No scheduling cycle recorded yet."})
    return JsonResponse({"available": True, "figures": _cycles_figure(cycles)})
