"""Learning the ETA band from this fleet's own outcomes (see scheduler.core.eta_band).

The first forecast of every waiting job (when it was made and the start it named) is kept
in Redis, one key per job, until the job starts or the forecast's horizon passes. Each
forecast cycle marks the jobs still waiting past their band's end (a miss, counted at once)
and, when a cycle starts a job, the pair (forecast wait, actual wait) joins a capped list of
recent outcomes; each forecast cycle replays that list into a calibration and publishes its
bounds in the cache, where pages and the API read them to show a band around an ETA.

All of it is advisory: if Redis loses these keys, or cannot be reached, the band falls back
to the default (and says it is not yet learned); a cycle never fails because of it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.core.cache import cache

from scheduler.core.eta_band import EtaCalibration
from scheduler.cycle.lock import redis_client

log = logging.getLogger(__name__)

FIRST_KEY = "fleet:eta:first:{}"
OUTCOMES_KEY = "fleet:eta:outcomes"
BAND_KEY = "fleet:eta:band"
WINDOW = 500
# Outcomes kept: starts and overdue marks together.
KEEP = 2 * WINDOW
OVERDUE = " o"  # suffix of a first-forecast value whose miss was counted


def remember_forecasts(now: float, estimates: Mapping[int, Any], ttl_s: float) -> None:
    """Keep the first forecast of each waiting job that has one (later ones do not replace
    it: the band is about what a job's owner was told when it started waiting)."""
    first = [(job_id, eta) for job_id, (_, eta, _) in estimates.items() if eta is not None]
    if not first:
        return
    try:
        pipe = _client().pipeline(transaction=False)
        ttl = max(int(ttl_s), 60)
        for job_id, eta in first:
            pipe.set(FIRST_KEY.format(job_id), f"{now:.3f} {eta:.3f}", nx=True, ex=ttl)
        pipe.execute()
    except Exception:  # noqa: BLE001 - advisory: the cycle goes on without it
        log.warning("could not keep ETA forecasts in Redis", exc_info=True)


def mark_overdue(now: float, waiting: Iterable[int], calibration: EtaCalibration) -> int:
    """Count a miss for each waiting job now past the end of its first forecast's band;
    returns how many were found this time."""
    ids = list(waiting)
    if not ids:
        return 0
    try:
        client = _client()
        keys = [FIRST_KEY.format(job_id) for job_id in ids]
        marks = []
        pipe = client.pipeline(transaction=False)
        for key, raw in zip(keys, client.mget(keys), strict=True):
            if raw is None or raw.decode().endswith(OVERDUE):
                continue
            at, eta = (float(x) for x in raw.decode().split())
            if calibration.overdue(eta - at, now - at):
                marks.append(json.dumps([round(max(eta - at, 0.0), 1), None]))
                pipe.set(key, raw.decode() + OVERDUE, xx=True, keepttl=True)
        pipe.execute()
        _append_outcomes(client, marks)
        return len(marks)
    except Exception:  # noqa: BLE001 - advisory
        log.warning("could not mark overdue ETA forecasts in Redis", exc_info=True)
        return 0


def learn_starts(now: float, started: Iterable[int]) -> int:
    """Record (forecast wait, actual wait, judged) for jobs this cycle started; returns how
    many had a forecast."""
    ids = list(started)
    if not ids:
        return 0
    try:
        client = _client()
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.getdel(FIRST_KEY.format(job_id))
        pairs = []
        for raw in pipe.execute():
            if raw is None:
                continue
            text = raw.decode()
            judged = text.endswith(OVERDUE)
            at, eta = (float(x) for x in text.removesuffix(OVERDUE).split())
            pairs.append(json.dumps([round(max(eta - at, 0.0), 1), round(now - at, 1), judged]))
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
    try:
        cache.set(BAND_KEY, calibration.published(), timeout=None)
    except Exception:  # noqa: BLE001 - advisory
        log.warning("could not publish the ETA band", exc_info=True)
    return calibration


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


def _append_outcomes(client: Any, items: list[str]) -> None:
    """Add outcomes (JSON) to the capped list, oldest dropped first."""
    if items:
        pipe = client.pipeline(transaction=False)
        pipe.rpush(OUTCOMES_KEY, *items)
        pipe.ltrim(OUTCOMES_KEY, -KEEP, -1)
        pipe.execute()


def _client() -> Any:
    return redis_client()
