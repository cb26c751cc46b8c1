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
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import DataError, IntegrityError, transaction
from django.db.models import Avg, Count, Max, Min, Q
from django.db.models.functions import TruncMinute
from django.utils import timezone

from fleet.models import Gpu, Node, TelemetryRollup, TelemetrySample
from fleet.services.telemetry_checks import (
    BOUNDS,
    MAX_ID,
    MAX_JOBS,
    MAX_SAMPLES,
    Bounds,
    Refused,
    job_usage_check,
    number,
    sample_check,
)

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
# Per node, a Redis hash of how many readings were refused, by the field that was wrong.
REFUSED_KEY = "telemetry:refused:{node}"
REFUSED_LOGGED_KEY = "telemetry:refused-logged:{node}"
REFUSED_TTL_S = 30 * 86400
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


# uuid -> (Gpu id, index) per node, kept briefly in process memory: ingest runs for every
# tick of every node, and GPUs change only when an agent registers.
_gpu_ids: dict[int, tuple[float, dict[str, tuple[int, int]]]] = {}


def _gpu_map(node: Node, *, refresh: bool = False) -> dict[str, tuple[int, int]]:
    cached = _gpu_ids.get(node.pk)
    if cached and not refresh and time.monotonic() - cached[0] < _GPU_MAP_TTL_S:
        return cached[1]
    mapping = {
        uuid: (pk, index)
        for uuid, pk, index in Gpu.objects.filter(node=node).values_list("uuid", "id", "index")
    }
    _gpu_ids[node.pk] = (time.monotonic(), mapping)
    return mapping


def _when(value: Any, default: datetime) -> datetime:
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return default


def telemetry_refused_key(node_name: str) -> str:
    return cache.make_key(REFUSED_KEY.format(node=node_name))


def _count_refused(node: Node, refused: Counter[str], example: str) -> None:
    """Add to the node's counters of refused readings (a Redis hash: one count per field
    that was wrong, and `total`) and say so in the log, at most once a minute per node."""
    total = sum(refused.values())
    try:
        with _redis().pipeline(transaction=False) as pipe:
            key = telemetry_refused_key(node.name)
            for field, n in refused.items():
                pipe.hincrby(key, field, n)
            pipe.hincrby(key, "total", total)
            pipe.expire(key, REFUSED_TTL_S)
            pipe.execute()
        loud = cache.add(REFUSED_LOGGED_KEY.format(node=node.name), 1, timeout=60)
    except Exception:
        loud = True
    (log.warning if loud else log.debug)(
        "refused %d telemetry reading(s) of node %s (%s), e.g. %s",
        total,
        node.name,
        ", ".join(f"{field}: {n}" for field, n in sorted(refused.items())),
        example,
    )


def telemetry_ingest(*, node: Node, payload: Any, now: datetime | None = None) -> int:
    """Store one telemetry message of `node`; returns the number of GPU samples kept.

    Each reading is checked on its own (fleet/services/telemetry_checks.py): one that is
    malformed, not finite, negative or out of range is refused and counted on the node
    (`telemetry_refused` reads the counts), and the other readings of the message are
    kept. Readings of GPUs the node has not registered are refused the same way."""
    now = now or timezone.now()
    refused: Counter[str] = Counter()
    example = ""
    if not isinstance(payload, dict) or not isinstance(payload.get("gpus") or [], list):
        _count_refused(node, Counter(payload=1), "the message is not a telemetry payload")
        return 0
    raw = payload.get("gpus") or []
    if len(raw) > MAX_SAMPLES:
        refused["gpus"] += len(raw) - MAX_SAMPLES
        example = f"gpus: more than {MAX_SAMPLES} readings in one message"
        raw = raw[:MAX_SAMPLES]
    samples = []
    for item in raw:
        try:
            samples.append(sample_check(item, now_s=now.timestamp()))
        except Refused as exc:
            refused[exc.field] += 1
            example = example or str(exc)
    ids = _gpu_map(node)
    if any(g["uuid"] not in ids for g in samples):
        ids = _gpu_map(node, refresh=True)
    backend = payload.get("backend")
    backend = backend[:20] if isinstance(backend, str) else ""
    latest: dict[str, dict[str, Any]] = {}
    rows = []
    for g in samples:
        if g["uuid"] not in ids:
            refused["uuid"] += 1
            example = example or f"uuid: {g['uuid'][:40]} is not a GPU of this node"
            continue
        gpu_id, index = ids[g["uuid"]]
        at = datetime.fromtimestamp(g["sampled_at"], tz=UTC)
        entry = {name: g[name] for name in LATEST_FIELDS}
        entry.update(
            index=index, sampled_at=at.isoformat(), backend=backend, processes=g["processes"]
        )
        latest[LATEST_KEY.format(uuid=g["uuid"])] = entry
        rows.append(json.dumps([gpu_id, g["sampled_at"], *(g[name] for name in _ROW[2:])]))
    usage: dict[str, Any] = {}
    jobs = payload.get("jobs") or {}
    if not isinstance(jobs, dict) or len(jobs) > MAX_JOBS:
        refused["jobs"] += 1
        example = example or "jobs: not a mapping of job ids to usage"
        jobs = {}
    for job_id, value in jobs.items():
        try:
            job_key, clean = job_usage_check(job_id, value)
        except Refused as exc:
            refused[exc.field] += 1
            example = example or str(exc)
            continue
        usage[JOB_USAGE_KEY.format(job_id=job_key)] = clean
    if refused:
        _count_refused(node, refused, example)
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


def _buffered_sample(raw: Any, now: datetime) -> TelemetrySample | None:
    """A buffered row as a sample, or None (logged) when it cannot be stored: rows are
    checked again here because a buffer may hold rows an older version let in."""
    try:
        row = dict(zip(_ROW, json.loads(raw), strict=True))
        gpu_id = number(row.pop("gpu_id"), Bounds(int, 1, MAX_ID), "gpu_id")
        at = number(row.pop("sampled_at"), Bounds(float, 0, 2**32), "sampled_at")
        values = {
            name: None if value is None else number(value, BOUNDS[name], name)
            for name, value in row.items()
        }
        if values["memory_total_mb"] is None:
            raise Refused("memory_total_mb", "missing")
    except (TypeError, ValueError) as exc:  # Refused and JSONDecodeError are ValueErrors
        log.warning("dropped a buffered telemetry row that cannot be stored (%s)", exc)
        return None
    return TelemetrySample(gpu_id=gpu_id, sampled_at=_when(at, now), **values)


def telemetry_flush(*, max_rows: int = 20000) -> int:
    """Write buffered samples to the raw history in one transaction; returns the rows
    written. Rows of GPUs that no longer exist (re-registered meanwhile) and rows that
    cannot be stored are dropped; one bad row never costs the others of the batch."""
    key = _buffer_key()
    client = _redis()
    with client.pipeline(transaction=True) as pipe:
        pipe.lrange(key, 0, max_rows - 1)
        pipe.ltrim(key, max_rows, -1)
        raw, _ = pipe.execute()
    if not raw:
        return 0
    now = timezone.now()
    checked = [s for s in (_buffered_sample(r, now) for r in raw) if s is not None]
    known = set(Gpu.objects.filter(pk__in={s.gpu_id for s in checked}).values_list("pk", flat=True))
    samples = [s for s in checked if s.gpu_id in known]
    try:
        with transaction.atomic():
            TelemetrySample.objects.bulk_create(samples, batch_size=1000)
    except (IntegrityError, DataError):
        # A GPU deleted since the check above, or a value the database refuses: store the
        # rows one by one and drop only those that fail. (A database that is down raises
        # OperationalError, which is not caught here.)
        log.warning("telemetry batch refused by the database; storing it row by row")
        stored = 0
        for sample in samples:
            try:
                with transaction.atomic():
                    sample.pk = None
                    sample.save(force_insert=True)
                stored += 1
            except (IntegrityError, DataError) as exc:
                log.warning("dropped a telemetry row of gpu %s: %s", sample.gpu_id, exc)
        return stored
    return len(samples)


def _in_range(field: str) -> Q:
    """Stored values of `field` an aggregate may use: rows an older version let in
    (Infinity, NaN, negative or absurd values) are left out, not averaged in. In
    PostgreSQL NaN sorts above every number, so the upper bound excludes it too."""
    bounds = BOUNDS[field]
    return Q(**{f"{field}__gte": bounds.low, f"{field}__lte": bounds.high})


def telemetry_rollup(*, now: datetime | None = None) -> dict[str, int]:
    """Fold raw samples into one-minute rollups (the current minute waits until it is
    over; the last few minutes are folded again so late samples count), then delete raw
    samples and rollups past their retention. Idempotent. Stored values outside their
    range are left out of the averages and maxima."""
    now = now or timezone.now()
    try:
        telemetry_flush()
    except Exception:  # the buffer's rows wait for the next round; fold what is stored
        log.exception("telemetry flush failed; rolling up the stored samples")
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
                util=Avg("util_percent", filter=_in_range("util_percent")),
                util_max=Max("util_percent", filter=_in_range("util_percent")),
                mem=Avg("memory_used_mb", filter=_in_range("memory_used_mb")),
                mem_max=Max("memory_used_mb", filter=_in_range("memory_used_mb")),
                total=Max("memory_total_mb", filter=_in_range("memory_total_mb")),
                temp=Avg("temperature_c", filter=_in_range("temperature_c")),
                temp_max=Max("temperature_c", filter=_in_range("temperature_c")),
                power=Avg("power_w", filter=_in_range("power_w")),
                power_max=Max("power_w", filter=_in_range("power_w")),
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
            if g["total"] is not None  # no stored value is usable: nothing to fold
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
