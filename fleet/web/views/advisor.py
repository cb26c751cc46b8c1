"""The policy advisor page (staff): start a run over the last N days, follow its progress,
compare what happened with every candidate, and apply one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from fleet.errors import ApplicationError
from fleet.web.access import staff_required
from scheduler.advisor import history, runs

COLUMNS = (
    ("wait_avg", "Avg wait", "seconds"),
    ("wait_p95", "p95 wait", "seconds"),
    ("jct_avg", "Avg JCT", "seconds"),
    ("utilization", "GPU utilization", "percent"),
    ("fairness_jain", "Team fairness (Jain)", "ratio"),
    ("preemptions_per_job", "Preemptions per job", "ratio"),
)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return "–"
    if kind == "seconds":
        return _duration(float(value))
    if kind == "percent":
        return f"{100 * float(value):.1f} %"
    return f"{float(value):.2f}"


def _rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    best = run.get("best") or {}
    entries: list[tuple[str, dict[str, Any]]] = []
    if run.get("actual"):
        entries.append(("actual", run["actual"]))
    entries += [(str(c["index"]), c) for c in run.get("candidates") or []]
    rows = []
    for key, entry in entries:
        metrics = entry.get("metrics") or {}
        rows.append(
            {
                "key": key,
                "actual": key == "actual",
                "label": entry.get("label", ""),
                "error": entry.get("error", ""),
                "not_finished": entry.get("not_finished", 0),
                "cells": [
                    {"text": _cell(metrics.get(m), kind), "best": key in best.get(m, ())}
                    for m, _, kind in COLUMNS
                ]
                if metrics
                else [],
                "teams": metrics.get("team_slowdown") or {},
            }
        )
    return rows


def _page(
    request: HttpRequest, run: dict[str, Any] | None, status: int = 200, **extra: Any
) -> HttpResponse:
    context = {
        "run": run,
        "started": datetime.fromisoformat(run["created_at"]) if run else None,
        "rows": _rows(run) if run and run["state"] == "done" else [],
        "columns": [label for _, label, _ in COLUMNS],
        "max_days": history.MAX_DAYS,
        "days": 7,
        "error": "",
        **extra,
    }
    return render(request, "web/advisor.html", context, status=status)


@staff_required
def advisor_page(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        text = request.POST.get("days", "").strip()
        days: Any = int(text) if text.isdigit() else text
        try:
            started = runs.advisor_run_start(user=request.user, days=days)
        except ApplicationError as error:
            return _page(
                request,
                runs.advisor_run_latest(),
                status=error.status_code,
                error=error.message,
                days=text,
            )
        return redirect(f"{reverse('advisor')}?run={started['id']}")
    run_id = request.GET.get("run", "")
    run: dict[str, Any] | None
    if run_id:
        try:
            run = runs.advisor_run_get(run_id=run_id)
        except ApplicationError as error:
            return _page(request, None, status=error.status_code, error=error.message)
    else:
        run = runs.advisor_run_latest()
    return _page(request, run)


@staff_required
@require_POST
def advisor_apply(request: HttpRequest, run_id: str) -> HttpResponse:
    text = request.POST.get("candidate", "").strip()
    try:
        row = runs.advisor_run_apply(
            run_id=run_id, candidate=int(text) if text.isdigit() else text, user=request.user
        )
    except ApplicationError as error:
        messages.error(request, f"Nothing was applied: {error.message}")
        return redirect(f"{reverse('advisor')}?run={run_id}")
    messages.success(
        request,
        f"The scheduler now uses {row.policy} with the advisor's weights; the next "
        "cycle applies them.",
    )
    return redirect("scheduler")


urlpatterns = [
    path("", advisor_page, name="advisor"),
    path("runs/<str:run_id>/apply/", advisor_apply, name="advisor-apply"),
]
