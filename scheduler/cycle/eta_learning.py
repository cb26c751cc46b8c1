"""Learning the ETA band from this fleet's own outcomes (see scheduler.core.eta_band).

The first forecast of every waiting job (when it was made and the start it named) is kept
in Redis, a field per job in one hash, until the job starts or the forecast's horizon
passes. Each forecast cycle marks the jobs still waiting past their band's end (a miss,
counted at once) and, when a cycle starts a job, the pair (forecast wait, actual wait) joins
a capped list of recent outcomes; each forecast cycle replays that list into a calibration,
adds the jobs still waiting on their first forecasts (censored: they have waited at least
this long), tells it the pace of first forecasts and starts over the last half hour (a wave
of submissions widens the band) and publishes its bounds in the cache, where pages and the API read them to show
a band around an ETA.

`recent_arrivals` reads the submissions the forecast expects again (see
scheduler.core.eta_arrivals): every job submitted in the last window, whatever its state
now, so that the short jobs that already ran and ended count too.

All of it is advisory: if Redis loses these keys, or cannot be reached, the band falls back
to the default (and says it is not yet learned); a cycle never fails because of it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import F

from fleet.models import Job
from scheduler.core.eta_arrivals import DEFAULT_WINDOW, Arrivals
from scheduler.core.eta_band import WAVE_WINDOW, EtaCalibration
from scheduler.core.model import PendingJob
from scheduler.cycle.lock import redis_client
from scheduler.cycle.snapshot import DbSnapshot, epoch

log = logging.getLogger(__name__)

FIRST_KEY = "fleet:eta:first"  # hash: job id -> "made-at eta[ o]"
OUTCOMES_KEY = "fleet:eta:outcomes"
BAND_KEY = "fleet:eta:band"
WINDOW = 500
# Outcomes kept: starts and overdue marks together.
KEEP = 2 * WINDOW
OVERDUE = " o"  # suffix of a first-forecast value whose miss was counted


def follow_forecasts(
    now: float,
    estimates: Mapping[int, Any],
    ttl_s: float,
    calibration: EtaCalibration,
    submitted: Mapping[int, float] | None = None,
) -> int:
    """After a forecast: keep the first forecast of each waiting job that has one (later
    ones do not replace it: the band is about what a job's owner was told when it started
    waiting), give the calibration every job still waiting on its first forecast (each a
    ratio of at least what it has reached, `EtaCalibration.censor`) and the pace of first
    forecasts shown and of starts over the last `WAVE_WINDOW` seconds, and how many jobs
    still wait on forecasts older than that (`EtaCalibration.pace`: a wave of submissions
    widens the band) and publish its bounds again, count a miss for each waiting job now past the end of its first forecast's band,
    and drop first forecasts older than `ttl_s`. Returns the misses found this time.
    `submitted` (job id -> submit time): a job first forecast now that was submitted before
    that window (its forecast was lost with Redis, or the forecast began after it) counts
    as an older waiting job, not as one of a wave.

    One read of every kept forecast and one write of what changed, whatever the queue's
    length: a forecast over thousands of waiting jobs costs a few Redis round trips, not
    one command per job."""
    try:
        client = _client()
        kept = {int(k): v.decode() for k, v in client.hgetall(FIRST_KEY).items()}
        new: dict[str, str] = {}
        for job_id, (_, eta, _) in estimates.items():
            if eta is not None and job_id not in kept:
                new[str(job_id)] = f"{now:.3f} {eta:.3f}"
        marks, marked, expired = [], {}, []
        horizon = max(float(ttl_s), 60.0)
        firsts = {
            job_id: tuple(float(x) for x in text.removesuffix(OVERDUE).split())
            for job_id, text in kept.items()
        }
        calibration.censor(
            (eta - at, now - at) for job_id, (at, eta) in firsts.items() if job_id in estimates
        )
        since = now - WAVE_WINDOW
        started = [(start, wait) for start, wait in calibration.starts if start > since]
        late = {int(k) for k in new if (submitted or {}).get(int(k), now) <= since}
        calibration.pace(
            sum(1 for at, _ in firsts.values() if at > since)
            + len(new)
            - len(late)
            + sum(1 for start, wait in started if start - wait > since),
            len(started),
            sum(1 for job_id, (at, _) in firsts.items() if at <= since and job_id in estimates)
            + len(late),
        )
        for job_id, text in kept.items():
            at, eta = firsts[job_id]
            if job_id in estimates and not text.endswith(OVERDUE):
                if calibration.overdue(eta - at, now - at):
                    marks.append(json.dumps([round(max(eta - at, 0.0), 1), None]))
                    marked[str(job_id)] = text + OVERDUE
            if now - at > horizon:  # counted above if it was a miss; then forgotten
                expired.append(str(job_id))
                marked.pop(str(job_id), None)
        pipe = client.pipeline(transaction=False)
        if new or marked:
            pipe.hset(FIRST_KEY, mapping={**new, **marked})
        if expired:
            pipe.hdel(FIRST_KEY, *expired)
        pipe.execute()
        _append_outcomes(client, marks)
        _publish(calibration)
        return len(marks)
    except Exception:  # noqa: BLE001 - advisory: the cycle goes on without it
        log.warning("could not keep ETA forecasts in Redis", exc_info=True)
        return 0


def learn_starts(now: float, started: Iterable[int]) -> int:
    """Record (forecast wait, actual wait, judged, started at) for jobs this cycle started;
    returns how many had a forecast."""
    ids = list(started)
    if not ids:
        return 0
    try:
        client = _client()
        fields = [str(job_id) for job_id in ids]
        pipe = client.pipeline(transaction=True)  # read and drop together
        pipe.hmget(FIRST_KEY, fields)
        pipe.hdel(FIRST_KEY, *fields)
        pairs = []
        for raw in pipe.execute()[0]:
            if raw is None:
                continue
            text = raw.decode()
            judged = text.endswith(OVERDUE)
            at, eta = (float(x) for x in text.removesuffix(OVERDUE).split())
            pairs.append(
                json.dumps(
                    [round(max(eta - at, 0.0), 1), round(now - at, 1), judged, round(now, 1)]
                )
            )
        _append_outcomes(client, pairs)
        return len(pairs)
    except Exception:  # noqa: BLE001 - advisory
        log.warning("could not record ETA outcomes in Redis", exc_info=True)
        return 0


def refresh_band() -> EtaCalibration:
    """Replay the recorded outcomes into a calibration and publish its bounds."""
    try:
        outcomes = [json.loads(item) for item in _client().lrange(OUTCOMES_KEY, 0, -1)]
    except Exception:  # noqa: BLE001 - advisory
        log.warning("could not read ETA outcomes from Redis", exc_info=True)
        outcomes = []
    calibration = EtaCalibration.from_outcomes(outcomes, window=WINDOW)
    _publish(calibration)
    return calibration


def _publish(calibration: EtaCalibration) -> None:
    try:
        cache.set(BAND_KEY, calibration.published(), timeout=None)
    except Exception:  # noqa: BLE001 - advisory
        log.warning("could not publish the ETA band", exc_info=True)


def current_calibration() -> EtaCalibration:
    """The published calibration (the default band when none is published)."""
    try:
        band = cache.get(BAND_KEY)
    except Exception:  # noqa: BLE001 - pages must render without Redis
        band = None
    return EtaCalibration.from_published(band) if band else EtaCalibration()


def band_for(
    eta: datetime | None, now: datetime, calibration: EtaCalibration
) -> tuple[datetime, datetime] | None:
    """The 80% band around a stored ETA, as seen now."""
    if eta is None:
        return None
    low, high = calibration.band(now.timestamp(), max(eta.timestamp(), now.timestamp()))
    if not (math.isfinite(low) and math.isfinite(high)):
        return None
    return (
        datetime.fromtimestamp(low, tz=eta.tzinfo),
        datetime.fromtimestamp(high, tz=eta.tzinfo),
    )


# Job columns that are PendingJob fields of the same name.
_SAME_FIELDS = (
    "gpus", "gpu_memory_mb", "gpu_compute_percent", "min_gpu_memory_mb", "priority", "qos",
    "preemptible", "name", "gpus_per_node", "cpus", "memory_mb", "same_group",
)  # fmt: skip


def recent_arrivals(snap: DbSnapshot, window: float = DEFAULT_WINDOW) -> Arrivals:
    """The jobs submitted in the last `window` seconds, as each was queued (runtime
    predicted from the snapshot's history), for `estimate(..., arrivals=...)`."""
    since = snap.now - timedelta(seconds=window)
    rows = Job.objects.filter(submitted_at__gt=since).values(
        "id", "owner_id", "time_limit", "gpu_model", *_SAME_FIELDS,
        slug=F("team__slug"), username=F("owner__username"), at=epoch("submitted_at"),
    )  # fmt: skip
    jobs = [
        PendingJob(
            id=r["id"],
            team=r["slug"],
            user=r["username"],
            submitted_at=r["at"].timestamp() if isinstance(r["at"], datetime) else float(r["at"]),
            time_limit=float(r["time_limit"]),
            gpu_model=r["gpu_model"] or None,
            predicted_runtime=snap.predict(r["owner_id"], r["name"], r["time_limit"]),
            **{name: r[name] for name in _SAME_FIELDS},
        )
        for r in rows
    ]
    return Arrivals.from_submissions(snap.core.now, jobs, window)


def _append_outcomes(client: Any, items: list[str]) -> None:
    """Add outcomes (JSON) to the capped list, oldest dropped first."""
    if items:
        pipe = client.pipeline(transaction=False)
        pipe.rpush(OUTCOMES_KEY, *items)
        pipe.ltrim(OUTCOMES_KEY, -KEEP, -1)
        pipe.execute()


def _client() -> Any:
    return redis_client()
