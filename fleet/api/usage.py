"""/api/v1/usage/: GPU, host CPU and memory time per team, per user or per attempt over a
period, as JSON or CSV.

Staff see every team; anyone else sees only the teams they belong to.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

from django.http import Http404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import renderers, serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.serializers import QuerySerializer
from fleet.models import Team
from fleet.selectors.usage import Attempt, Usage, gpu_hours
from fleet.services.access import team_ids

DEFAULT_PERIOD = timedelta(days=7)
# An attempt listing over years of history would be unbounded; a year is plenty.
MAX_PERIOD = timedelta(days=366)

# sacct-like column names for the per-attempt listing.
ATTEMPT_COLUMNS = [
    "JobID", "JobName", "User", "Account", "Attempt", "State", "Start", "End", "Elapsed",
    "AllocGPUs", "GPUSeconds", "GPUHours", "AllocCPUS", "CPUHours", "AllocMemMB", "MemGBHours",
]  # fmt: skip


class CsvRenderer(renderers.BaseRenderer):
    """Renders the `csv` text a view put in its data; an error as a one-line message."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None):
        if isinstance(data, dict) and "csv" in data:
            return data["csv"].encode()
        if isinstance(data, dict) and "message" in data:
            return f"error: {data['message']}\n".encode()
        return str(data).encode()


def _elapsed(seconds: float) -> str:
    """[D-]HH:MM:SS, as sacct prints it."""
    whole = int(round(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{text}" if days else text


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _attempt_row(a: Attempt) -> dict[str, Any]:
    return {
        "job": a.job_id,
        "name": a.job_name,
        "user": a.user,
        "team": a.team,
        "attempt": a.attempt,
        "state": a.state,
        "start": _iso(a.start),
        "end": _iso(a.end),
        "seconds": round(a.seconds, 3),
        "gpus": a.gpus,
        "gpu_seconds": round(a.gpu_seconds, 3),
        "gpu_hours": round(a.gpu_seconds / 3600, 6),
        "cpus": a.cpus,
        "cpu_hours": round(a.cpu_seconds / 3600, 6),
        "memory_mb": a.memory_mb,
        "mem_gb_hours": round(a.mem_gb_seconds / 3600, 6),
    }


def _group_rows(usage: Usage, by: str) -> list[dict[str, Any]]:
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for a in usage.attempts:
        key: tuple[str, ...] = (a.team,) if by == "team" else (a.team, a.user)
        row = groups.setdefault(
            key,
            {
                "team": a.team,
                **({"user": a.user} if by == "user" else {}),
                "gpu_seconds": 0.0,
                "cpu_seconds": 0.0,
                "mem_gb_seconds": 0.0,
                "attempts": 0,
                "jobs": set(),
            },  # fmt: skip
        )
        row["gpu_seconds"] += a.gpu_seconds
        row["cpu_seconds"] += a.cpu_seconds
        row["mem_gb_seconds"] += a.mem_gb_seconds
        row["attempts"] += 1
        row["jobs"].add(a.job_id)
    rows = []
    for key in sorted(groups):
        row = groups[key]
        row["jobs"] = len(row["jobs"])
        row["gpu_hours"] = round(row["gpu_seconds"] / 3600, 6)
        row["gpu_seconds"] = round(row["gpu_seconds"], 3)
        row["cpu_hours"] = round(row.pop("cpu_seconds") / 3600, 6)
        row["mem_gb_hours"] = round(row.pop("mem_gb_seconds") / 3600, 6)
        rows.append(row)
    return rows


def _csv(rows: list[dict[str, Any]], by: str) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if by == "attempt":
        writer.writerow(ATTEMPT_COLUMNS)
        for r in rows:
            writer.writerow([
                r["job"], r["name"], r["user"], r["team"], r["attempt"], r["state"], r["start"],
                r["end"], _elapsed(r["seconds"]), r["gpus"], r["gpu_seconds"], r["gpu_hours"],
                r["cpus"], r["cpu_hours"], r["memory_mb"], r["mem_gb_hours"],
            ])  # fmt: skip
    else:
        head = ["Account"] + (["User"] if by == "user" else [])
        writer.writerow(
            head + ["Jobs", "Attempts", "GPUSeconds", "GPUHours", "CPUHours", "MemGBHours"]
        )
        for r in rows:
            who = [r["team"]] + ([r["user"]] if by == "user" else [])
            writer.writerow(
                who
                + [r["jobs"], r["attempts"], r["gpu_seconds"], r["gpu_hours"]]
                + [r["cpu_hours"], r["mem_gb_hours"]]
            )
    return out.getvalue()


class UsageApi(APIView):
    renderer_classes = [renderers.JSONRenderer, CsvRenderer]

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # DRF answers an unknown ?format= with 404; it is a bad parameter.
        try:
            return super().perform_content_negotiation(request, force=force)
        except Http404:
            raise ValidationError({"format": ["Give format=json or format=csv."]})

    class FilterSerializer(QuerySerializer):
        since = serializers.DateTimeField(required=False, help_text="Default: 7 days ago.")
        until = serializers.DateTimeField(required=False, help_text="Default: now.")
        by = serializers.ChoiceField(choices=["team", "user", "attempt"], default="team")
        team = serializers.SlugField(required=False, help_text="Only this team.")
        format = serializers.ChoiceField(choices=["json", "csv"], required=False)

    @extend_schema(
        parameters=[FilterSerializer],
        responses={
            (200, "application/json"): OpenApiTypes.OBJECT,
            (200, "text/csv"): OpenApiTypes.STR,
        },
        summary="GPU, CPU and memory time per team, user or attempt (every attempt counts).",
    )
    def get(self, request: Request) -> Response:
        params = self.FilterSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        now = timezone.now()
        until = params.validated_data.get("until") or now
        since = params.validated_data.get("since") or until - DEFAULT_PERIOD
        if since >= until:
            raise ValidationError({"since": ["since must be before until."]})
        if until - since > MAX_PERIOD:
            raise ValidationError({"since": [f"Ask for at most {MAX_PERIOD.days} days at a time."]})
        user = request.user
        visible: set[int] | None = None if user.is_staff else set(team_ids(user))
        slug = params.validated_data.get("team")
        if slug:
            team = Team.objects.filter(slug=slug).values_list("id", flat=True).first()
            if team is None or (visible is not None and team not in visible):
                raise ValidationError(
                    {"team": [f"No team {slug!r} among the teams whose usage you may see."]}
                )
            visible = {team}
        usage = gpu_hours(since=since, until=until, now=now, team_ids=visible)
        by = params.validated_data["by"]
        if by == "attempt":
            rows = [_attempt_row(a) for a in usage.attempts]
        else:
            rows = _group_rows(usage, by)
        if request.accepted_renderer.format == "csv":
            return Response({"csv": _csv(rows, by)}, content_type="text/csv; charset=utf-8")
        total = sum(a.gpu_seconds for a in usage.attempts)
        cpu = sum(a.cpu_seconds for a in usage.attempts)
        mem = sum(a.mem_gb_seconds for a in usage.attempts)
        return Response(
            {
                "since": _iso(since),
                "until": _iso(until),
                "by": by,
                "gpu_seconds": round(total, 3),
                "gpu_hours": round(total / 3600, 6),
                "cpu_hours": round(cpu / 3600, 6),
                "mem_gb_hours": round(mem / 3600, 6),
                "rows": rows,
            }
        )
