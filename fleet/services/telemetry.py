"""GPU telemetry on the control side: ingest, rollups, retention.

Each agent tick brings one sample per GPU (see workers/telemetry.py for the message).
Ingest writes the latest sample of each GPU to the cache (live views read only that) and
appends the tick's rows to a buffer in Redis; the buffer is written to the raw history in
one bulk insert when it holds FLEET_TELEMETRY_BATCH rows or FLEET_TELEMETRY_FLUSH_INTERVAL
seconds have passed, so the database sees one commit per batch rather than one per tick
(commits dominate the cost). Losing Redis loses at most that window of history, never job
state. `telemetry_rollup` (beat, every minute) flushes, folds raw samples into one-minute
rollups and deletes what is older than the retention windows, so both tables stay bounded
as the fleet grows.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Avg, Count, Max, Min
from django.db.models.functions import TruncMinute
from django.utils import timezone

from fleet.models import Gpu, Node, TelemetryRollup, TelemetrySample

log = logging.getLogger(__name__)

LATEST_KEY = "telemetry:gpu:{uuid}"
JOB_USAGE_KEY = "telemetry:job:{job_id}"
LATEST_FIELDS = (
    "util_percent",
    "memory_used_mb",
    "memory_total_mb",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "memory_util_percent",
    "fan_percent",
    "throttle_reasons",
    "ecc_errors",
)
ROLLUP_LOOKBACK = timedelta(minutes=5)  # minutes re-rolled each round, for late samples
BUFFER_KEY = "telemetry:buffer"
FLUSH_TIMER_KEY = "telemetry:flushed-recently"
_GPU_MAP_TTL_S = 60.0
_ROW = ("gpu_id", "sampled_at", "util_percent", "memory_used_mb", "memory_total_mb",
        "temperature_c", "power_w", "sm_clock_mhz")  # fmt: skip


def _setting(name: str, default: int) -> int:
    value = getattr(settings, name, None)
    return int(value if value is not None else os.environ.get(name, default))


def raw_retention() -> timedelta:
    return timedelta(seconds=_setting("FLEET_TELEMETRY_RAW_RETENTION", 3600))


def rollup_retention() -> timedelta:
    return timedelta(seconds=_setting("FLEET_TELEMETRY_ROLLUP_RETENTION", 7 * 86400))


def latest_ttl_s() -> int:
    return _setting("FLEET_TELEMETRY_LATEST_TTL", 600)


def _redis() -> Any:
    # The cache's own Redis connection pool; the buffer needs list operations.
    return cache._cache.get_client(write=True)  # type: ignore[attr-defined]


def _buffer_key() -> str:
    return cache.make_key(BUFFER_KEY)


# uuid -> Gpu id per node, kept briefly in process memory: ingest runs for every tick of
# every node, and GPUs change only when an agent registers.
_gpu_ids: dict[int, tuple[float, dict[str, int]]] = {}


def _gpu_map(node: Node, *, refresh: bool = False) -> dict[str, int]:
    cached = _gpu_ids.get(node.pk)
    if cached and not refresh and time.monotonic() - cached[0] < _GPU_MAP_TTL_S:
        return cached[1]
    mapping = dict(Gpu.objects.filter(node=node).values_list("uuid", "id"))
    _gpu_ids[node.pk] = (time.monotonic(), mapping)
    return mapping


def _when(value: Any, default: datetime) -> datetime:
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return default


def telemetry_ingest(*, node: Node, payload: dict[str, Any], now: datetime | None = None) -> int:
    """Store one telemetry message of `node`; returns the number of GPU samples kept.
    Samples for GPUs the node has not registered are dropped."""
    now = now or timezone.now()
    gpus = [g for g in payload.get("gpus") or [] if isinstance(g, dict) and g.get("uuid")]
    ids = _gpu_map(node)
    if any(g["uuid"] not in ids for g in gpus):
        ids = _gpu_map(node, refresh=True)
    latest: dict[str, dict[str, Any]] = {}
    rows = []
    for g in gpus:
        gpu_id = ids.get(g["uuid"])
        if gpu_id is None:
            continue
        at = _when(g.get("sampled_at"), now)
        entry = {name: g.get(name) for name in LATEST_FIELDS}
        entry.update(
            index=g.get("index"),
            sampled_at=at.isoformat(),
            backend=payload.get("backend", ""),
            processes=[
                {"pid": p.get("pid"), "used_memory_mb": p.get("used_memory_mb"),
                 "job_id": p.get("job_id")}
                for p in g.get("processes") or []
                if isinstance(p, dict)
            ],
        )  # fmt: skip
        latest[LATEST_KEY.format(uuid=g["uuid"])] = entry
        row = [gpu_id, at.timestamp(), *(g.get(name) for name in _ROW[2:])]
        row[4] = int(row[4] or 0)
        rows.append(json.dumps(row))
    usage = {
        JOB_USAGE_KEY.format(job_id=job_id): value
        for job_id, value in (payload.get("jobs") or {}).items()
    }
    try:
        cache.set_many({**latest, **usage}, timeout=latest_ttl_s())
    except Exception:  # the cache is Redis: a live view goes stale, history is still written
        log.warning("could not cache the latest telemetry of node %s", node.name)
    if not rows:
        return 0
    try:
        buffered = _redis().rpush(_buffer_key(), *rows)
        due = buffered >= _setting("FLEET_TELEMETRY_BATCH", 2000) or cache.add(
            FLUSH_TIMER_KEY, 1, timeout=_setting("FLEET_TELEMETRY_FLUSH_INTERVAL", 5)
        )
    except Exception:
        log.warning("telemetry buffer unavailable; dropped a tick of node %s", node.name)
        return 0
    if due:
        telemetry_flush()
    return len(rows)


def telemetry_flush(*, max_rows: int = 20000) -> int:
    """Write buffered samples to the raw history in one transaction; returns the rows
    written. Rows of GPUs that no longer exist (re-registered meanwhile) are dropped."""
    key = _buffer_key()
    client = _redis()
    with client.pipeline(transaction=True) as pipe:
        pipe.lrange(key, 0, max_rows - 1)
        pipe.ltrim(key, max_rows, -1)
        raw, _ = pipe.execute()
    if not raw:
        return 0
    rows = [dict(zip(_ROW, json.loads(r), strict=True)) for r in raw]
    known = set(Gpu.objects.filter(pk__in={r["gpu_id"] for r in rows}).values_list("pk", flat=True))
    now = timezone.now()
    samples = [
        TelemetrySample(**(r | {"sampled_at": _when(r["sampled_at"], now)}))
        for r in rows
        if r["gpu_id"] in known
    ]
    with transaction.atomic():
        TelemetrySample.objects.bulk_create(samples, batch_size=1000)
    return len(samples)


def telemetry_rollup(*, now: datetime | None = None) -> dict[str, int]:
    """Fold raw samples into one-minute rollups (the current minute waits until it is
    over; the last few minutes are folded again so late samples count), then delete raw
    samples and rollups past their retention. Idempotent."""
    now = now or timezone.now()
    telemetry_flush()
    end = now.replace(second=0, microsecond=0)
    last = TelemetryRollup.objects.aggregate(m=Max("minute"))["m"]
    if last is None:
        first = TelemetrySample.objects.aggregate(m=Min("sampled_at"))["m"]
        start = first.replace(second=0, microsecond=0) if first else end
    else:
        start = min(last, end - ROLLUP_LOOKBACK)
    rolled = 0
    if start < end:
        groups = (
            TelemetrySample.objects.filter(sampled_at__gte=start, sampled_at__lt=end)
            .annotate(minute=TruncMinute("sampled_at"))
            .values("gpu_id", "minute")
            .annotate(
                n=Count("id"),
                util=Avg("util_percent"),
                util_max=Max("util_percent"),
                mem=Avg("memory_used_mb"),
                mem_max=Max("memory_used_mb"),
                total=Max("memory_total_mb"),
                temp=Avg("temperature_c"),
                temp_max=Max("temperature_c"),
                power=Avg("power_w"),
                power_max=Max("power_w"),
            )
        )
        rollups = [
            TelemetryRollup(
                gpu_id=g["gpu_id"],
                minute=g["minute"],
                samples=g["n"],
                util_percent=g["util"],
                util_percent_max=g["util_max"],
                memory_used_mb=g["mem"],
                memory_used_mb_max=g["mem_max"],
                memory_total_mb=g["total"],
                temperature_c=g["temp"],
                temperature_c_max=g["temp_max"],
                power_w=g["power"],
                power_w_max=g["power_max"],
            )
            for g in groups
        ]
        TelemetryRollup.objects.bulk_create(
            rollups,
            batch_size=1000,
            update_conflicts=True,
            unique_fields=["gpu", "minute"],
            update_fields=[
                "samples", "util_percent", "util_percent_max", "memory_used_mb",
                "memory_used_mb_max", "memory_total_mb", "temperature_c",
                "temperature_c_max", "power_w", "power_w_max",
            ],
        )  # fmt: skip
        rolled = len(rollups)
    raw_deleted, _ = TelemetrySample.objects.filter(sampled_at__lt=now - raw_retention()).delete()
    rollups_deleted, _ = TelemetryRollup.objects.filter(
        minute__lt=now - rollup_retention()
    ).delete()
    return {"rolled": rolled, "raw_deleted": raw_deleted, "rollups_deleted": rollups_deleted}
