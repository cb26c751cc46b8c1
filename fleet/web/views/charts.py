"""JSON for the dashboard's Plotly charts (session auth, the pages' permission rules).

Every response says whether data exists: `{"available": false, "message": ...}` when the
telemetry store has not landed or holds nothing for the range, so the page says so
instead of drawing an empty or invented curve."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.http import Http404, HttpRequest, JsonResponse
from django.utils import timezone

from fleet.errors import NotFound
from fleet.models import Node
from fleet.selectors.jobs import job_get
from fleet.selectors.nodes import node_get
from fleet.web import sources
from fleet.web.access import member_required

METRICS = {
    "util": ("util_percent", "GPU utilization (%)"),
    "memory": ("memory_used_mb", "GPU memory used (MB)"),
    "power": ("power_w", "Power draw (W)"),
    "temperature": ("temperature_c", "Temperature (°C)"),
}
RANGES = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
DEFAULT_RANGE = "1h"


def _at(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, tz=UTC).isoformat()
    return str(value)


def figures(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per metric, a Plotly figure with one line per GPU."""
    out: dict[str, dict[str, Any]] = {}
    for metric, (field, title) in METRICS.items():
        lines: dict[int, dict[str, Any]] = {}
        for row in rows:
            value = row.get(field)
            if value is None:
                continue
            index = int(row["index"])
            line = lines.setdefault(
                index,
                {"type": "scatter", "mode": "lines", "name": f"GPU {index}", "x": [], "y": []},
            )
            line["x"].append(_at(row["at"]))
            line["y"].append(value)
        out[metric] = {
            "data": [lines[i] for i in sorted(lines)],
            "layout": {"title": {"text": title}, "yaxis": {"rangemode": "tozero"}},
        }
    return out


def telemetry_payload(
    node: Node, since: datetime, until: datetime, indices: list[int] | None
) -> dict[str, Any]:
    rows = sources.telemetry_history(node=node, since=since, until=until, gpu_indices=indices)
    if rows is None:
        return {"available": False, "message": "No telemetry yet: GPU history is not recorded."}
    if not rows:
        return {"available": False, "message": f"No telemetry yet for {node.name} in this range."}
    return {"available": True, "figures": figures(rows)}


@member_required
def node_telemetry(request: HttpRequest, name: str) -> JsonResponse:
    try:
        node = node_get(name=name)
    except NotFound as error:
        raise Http404(error.message)
    span = RANGES.get(request.GET.get("range", DEFAULT_RANGE), RANGES[DEFAULT_RANGE])
    until = timezone.now()
    return JsonResponse(telemetry_payload(node, until - span, until, None))


@member_required
def job_telemetry(request: HttpRequest, job_id: int) -> JsonResponse:
    try:
        job = job_get(job_id=job_id, fetched_by=request.user)
    except NotFound as error:
        raise Http404(error.message)
    if job.started_at is None:
        return JsonResponse(
            {
                "available": False,
                "message": "Telemetry appears here once the job runs (charts refresh every 10 s).",
            }
        )
    if job.node is None:
        # A finished job no longer names its node when it went back to the queue.
        return JsonResponse({"available": False, "message": "No telemetry: the job holds no node."})
    until = job.finished_at or timezone.now()
    return JsonResponse(telemetry_payload(job.node, job.started_at, until, job.gpu_indices))
