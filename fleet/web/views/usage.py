"""Teams and usage: GPU-hours, CPU-hours and memory GB-hours per team and per user over a
chosen period, and each team's guaranteed, allocated and used GPUs."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from fleet.selectors.usage import gpu_hours, team_allocation
from fleet.web import live
from fleet.web.access import member_required

PERIODS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
DEFAULT_PERIOD = "7d"
TOP_USERS = 25


def period_bounds(request: HttpRequest, now: datetime) -> tuple[str, datetime, datetime]:
    period = request.GET.get("period", DEFAULT_PERIOD)
    if period not in PERIODS:
        period = DEFAULT_PERIOD
    return period, now - PERIODS[period], now


def usage_data(period: str, since: datetime, until: datetime, now: datetime) -> dict[str, Any]:
    usage = gpu_hours(since=since, until=until, now=now)
    teams = team_allocation()
    host: dict[tuple[str, ...], list[float]] = {}
    for a in usage.attempts:
        for key in ((a.team,), (a.team, a.user)):
            seconds = host.setdefault(key, [0.0, 0.0])
            seconds[0] += a.cpu_seconds
            seconds[1] += a.mem_gb_seconds
    for team in teams:
        cpu, mem = host.get((team["slug"],), [0.0, 0.0])
        team["cpu_hours"] = round(cpu / 3600, 3)
        team["mem_gb_hours"] = round(mem / 3600, 3)
        team["gpu_hours"] = round(usage.by_team.get(team["slug"], 0.0), 3)
        # Average GPUs in use over the period.
        team["used"] = round(usage.by_team.get(team["slug"], 0.0) / usage.hours, 2)
    users = sorted(usage.by_user.items(), key=lambda item: -item[1])[:TOP_USERS]
    user_rows = [
        {
            "team": t,
            "user": u,
            "gpu_hours": round(h, 3),
            "cpu_hours": round(host.get((t, u), [0.0, 0.0])[0] / 3600, 3),
            "mem_gb_hours": round(host.get((t, u), [0.0, 0.0])[1] / 3600, 3),
        }
        for (t, u), h in users
    ]
    slugs = [t["slug"] for t in teams]
    bar = {"type": "bar"}
    figures = {
        "teams": {
            "data": [
                {**bar, "name": "GPU-hours", "x": slugs, "y": [t["gpu_hours"] for t in teams]}
            ],
            "layout": {"title": {"text": f"GPU-hours per team, last {period}"}},
        },
        "users": {
            "data": [
                {
                    **bar,
                    "name": "GPU-hours",
                    "x": [f"{r['user']} ({r['team']})" for r in user_rows],
                    "y": [r["gpu_hours"] for r in user_rows],
                }
            ],
            "layout": {"title": {"text": f"GPU-hours per user, last {period}"}},
        },
        "allocation": {
            "data": [
                {**bar, "name": "guaranteed", "x": slugs, "y": [t["guaranteed"] for t in teams]},
                {**bar, "name": "allocated now", "x": slugs, "y": [t["allocated"] for t in teams]},
                {
                    **bar,
                    "name": f"used (average, {period})",
                    "x": slugs,
                    "y": [t["used"] for t in teams],
                },
            ],
            "layout": {"title": {"text": "GPUs: guaranteed, allocated, used"}, "barmode": "group"},
        },
    }
    return {
        "available": True,
        "figures": figures,
        "teams": teams,
        "users": user_rows,
        "total": round(usage.total, 3),
        "cpu_total": round(sum(a.cpu_seconds for a in usage.attempts) / 3600, 3),
        "mem_gb_total": round(sum(a.mem_gb_seconds for a in usage.attempts) / 3600, 3),
    }


def _cached(request: HttpRequest) -> tuple[str, dict[str, Any]]:
    now = timezone.now()
    period, since, until = period_bounds(request, now)
    text = live.shared_fragment(
        f"usage:{period}", lambda: json.dumps(usage_data(period, since, until, now))
    )
    return period, json.loads(text)


@member_required
def usage_page(request: HttpRequest) -> HttpResponse:
    period, data = _cached(request)
    return render(
        request,
        "web/usage.html",
        {"period": period, "periods": list(PERIODS), "data": data, "figures": data["figures"]},
    )


@member_required
def usage_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(_cached(request)[1])
