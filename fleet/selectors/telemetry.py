"""Reading GPU telemetry (latest samples, history) and job output."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fleet.models import (
    Gpu,
    Job,
    JobLogChunk,
    JobMember,
    Node,
    TelemetryRollup,
    TelemetrySample,
)
from fleet.models.jobs import ACTIVE_STATES
from fleet.services.telemetry import LATEST_KEY, raw_retention, telemetry_refused_key
from fleet.services.telemetry_checks import BOUNDS, value_ok

POINT_FIELDS = ("util_percent", "memory_used_mb", "memory_total_mb", "temperature_c", "power_w")
LOG_READ_BYTES = 65536


def gpu_latest_samples(gpus: list[Gpu]) -> dict[str, dict[str, Any]]:
    """Latest cached sample of each GPU, by uuid (GPUs without a recent one are left out)."""
    if not gpus:
        return {}
    keys = {LATEST_KEY.format(uuid=g.uuid): g.uuid for g in gpus}
    try:
        found = cache.get_many(list(keys))
    except Exception:
        return {}
    clean = {keys[k]: _shown_sample(v) for k, v in found.items()}
    return {uuid: sample for uuid, sample in clean.items() if sample is not None}


def _shown_sample(sample: Any) -> dict[str, Any] | None:
    """A cached sample as readers may show it: values outside their range (cached by an
    older version, or by hand) become None; a sample without a readable time is left out."""
    if not isinstance(sample, dict):
        return None
    at = sample.get("sampled_at")
    try:
        if not isinstance(at, str) or parse_datetime(at) is None:
            return None
    except ValueError:
        return None
    shown = dict(sample)
    for name in BOUNDS:
        if name in shown and not value_ok(name, shown[name]):
            shown[name] = None
    for name in ("processes", "throttle_reasons"):
        if not isinstance(shown.get(name, []), list):
            shown[name] = []
    return shown


def telemetry_refused(*, node: Node) -> dict[str, int]:
    """How many telemetry readings of `node` were refused, by the field that was wrong,
    with `total`; empty when none were (or the cache is unavailable)."""
    try:
        counts = cache._cache.get_client().hgetall(telemetry_refused_key(node.name))  # type: ignore[attr-defined]
    except Exception:
        return {}
    return {k.decode(): int(v) for k, v in counts.items()}


def _shown_point(point: dict[str, Any]) -> dict[str, Any]:
    """A stored history point with values outside their range (stored by an older
    version) replaced by None, so a chart or the API never meets Infinity or NaN."""
    for name, value in point.items():
        bounds = BOUNDS.get(name.removesuffix("_max"))
        if (
            bounds is not None
            and value is not None
            and not value_ok(name.removesuffix("_max"), value)
        ):
            point[name] = None
    return point


def telemetry_history(
    *,
    node: Node,
    gpu_index: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """GPU history of one node between `since` (default: an hour ago) and `until`
    (default: now). Raw samples when the range lies within the raw retention window,
    one-minute rollups (averages) otherwise."""
    now = now or timezone.now()
    until = until or now
    since = since or until - timedelta(hours=1)
    raw = since >= now - raw_retention()
    gpus = list(node.gpus.order_by("index"))
    if gpu_index is not None:
        gpus = [g for g in gpus if g.index == gpu_index]
    points: dict[int, list[dict[str, Any]]] = {g.pk: [] for g in gpus}
    if raw:
        rows = TelemetrySample.objects.filter(
            gpu__in=gpus, sampled_at__gte=since, sampled_at__lte=until
        ).order_by("sampled_at")
        for r in rows.values("gpu_id", "sampled_at", *POINT_FIELDS):
            points[r.pop("gpu_id")].append(_shown_point({"t": r.pop("sampled_at"), **r}))
    else:
        rollups = TelemetryRollup.objects.filter(
            gpu__in=gpus, minute__gte=since, minute__lte=until
        ).order_by("minute")
        for r in rollups.values("gpu_id", "minute", "util_percent_max", *POINT_FIELDS):
            points[r.pop("gpu_id")].append(_shown_point({"t": r.pop("minute"), **r}))
    return {
        "node": node.name,
        "resolution": "raw" if raw else "1m",
        "since": since,
        "until": until,
        "gpus": [{"index": g.index, "uuid": g.uuid, "points": points[g.pk]} for g in gpus],
    }


def _utf8_safe_end(data: bytes) -> int:
    """Length of the longest prefix that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead byte
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte >= 0xF0 else 1
        return len(data) if need <= back else len(data) - back
    return len(data)


def job_log_ranks(*, job: Job, attempt: int) -> list[int]:
    """The ranks of an attempt whose output can be read: its members (rank 0 for a
    single-node job), and any rank that stored output."""
    ranks = set(JobMember.objects.filter(job=job, attempt=attempt).values_list("rank", flat=True))
    ranks |= set(
        JobLogChunk.objects.filter(job=job, attempt=attempt)
        .values_list("rank", flat=True)
        .distinct()
    )
    return sorted(ranks | {0})


def job_log_read(
    *,
    job: Job,
    offset: int = 0,
    attempt: int | None = None,
    rank: int = 0,
    limit: int = LOG_READ_BYTES,
) -> dict[str, Any]:
    """Output of one member (`rank`, default 0) of one attempt (default: the latest) from
    byte `offset`: {"data", "offset", "next_offset", "complete", "attempt", "rank",
    "ranks"}. `complete` is true once the attempt has ended and everything that member
    sent has been read; `ranks` lists the members whose output can be read."""
    attempt = job.attempt if attempt is None else attempt
    chunks = JobLogChunk.objects.filter(
        job=job, attempt=attempt, rank=rank, end__gt=offset, offset__lt=offset + limit
    ).order_by("offset")
    buf = bytearray()
    pos = offset
    for chunk in chunks:
        if chunk.offset > pos:
            break  # a chunk still in transit: read up to the gap
        buf += bytes(chunk.data)[pos - chunk.offset :]
        pos = offset + len(buf)
    data = bytes(buf[:limit])
    stored = JobLogChunk.objects.filter(job=job, attempt=attempt, rank=rank)
    last = stored.order_by("-end").values("end").first()
    total = last["end"] if last else 0
    ended = stored.filter(eof=True).exists() or not (
        job.attempt == attempt and job.state in ACTIVE_STATES
    )
    if offset + len(data) < total or not ended:
        data = data[: _utf8_safe_end(data)]
    next_offset = offset + len(data)
    return {
        "data": data.decode("utf-8", errors="replace"),
        "offset": offset,
        "next_offset": next_offset,
        "complete": ended and next_offset >= total,
        "attempt": attempt,
        "rank": rank,
        "ranks": job_log_ranks(job=job, attempt=attempt),
    }
