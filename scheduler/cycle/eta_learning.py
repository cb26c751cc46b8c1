"""Learning the ETA band from this fleet's own outcomes (see scheduler.core.eta_band).

The first forecast of every waiting job (when it was made and the start it named) is kept
in Redis, one key per job, until the job starts or the forecast's horizon passes. When a
cycle starts the job, the pair (forecast wait, actual wait) joins a capped list of recent
outcomes; each forecast cycle rebuilds the calibration from that list and stores its
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


def remember_forecasts(now: float, estimates: Mapping[int, Any], ttl_s: float) -> None:
    """Keep the first forecast of each waiting job that has one (later ones do not replace
    it: the band is about what a job's owner was told when it started waiting)."""
    first = [(job_id, eta) for job_id, (_, eta, _) in estimates.items() if eta is not None]
    if not first:
        return
    try:
        pipe = redis_client().pipeline(transaction=False)  # type: ignore[attr-defined]
        ttl = max(int(ttl_s), 60)
        for job_id, eta in first:
            pipe.set(FIRST_KEY.format(job_id), f"{now:.3f} {eta:.3f}", nx=True, ex=ttl)
        pipe.execute()
    except Exception:  # noqa: BLE001 - advisory: the cycle goes on without it
        log.warning("could not keep ETA forecasts in Redis", exc_info=True)


def learn_starts(now: float, started: Iterable[int]) -> int:
    """Record (forecast wait, actual wait) for jobs this cycle started; returns how many."""
    ids = list(started)
    if not ids:
        return 0
    try:
        client = redis_client()
        pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
        for job_id in ids:
            pipe.getdel(FIRST_KEY.format(job_id))
        pairs = []
        for raw in pipe.execute():
            if raw is None:
                continue
            at, eta = (float(x) for x in raw.decode().split())
            if eta > at:  # a job forecast to start at once teaches the band nothing
                pairs.append(json.dumps([round(eta - at, 1), round(now - at, 1)]))
        if pairs:
            pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
            pipe.rpush(OUTCOMES_KEY, *pairs)
            pipe.ltrim(OUTCOMES_KEY, -WINDOW, -1)
            pipe.execute()
        return len(pairs)
    except Exception:  # noqa: BLE001 - advisory
        log.warning("could not record ETA outcomes in Redis", exc_info=True)
        return 0


def refresh_band() -> dict[str, Any]:
    """Rebuild the calibration from the recorded outcomes and publish its bounds."""
    try:
        raw = redis_client().lrange(OUTCOMES_KEY, 0, -1)  # type: ignore[attr-defined]
        outcomes = [tuple(json.loads(item)) for item in raw]
    except Exception:  # noqa: BLE001 - advisory
        log.warning("could not read ETA outcomes from Redis", exc_info=True)
        outcomes = []
    calibration = EtaCalibration.from_outcomes(outcomes, window=WINDOW)
    lo, hi = calibration.log_bounds()
    band = {
        "lo": lo,
        "hi": hi,
        "samples": calibration.samples,
        "calibrated": calibration.calibrated,
    }
    try:
        cache.set(BAND_KEY, band, timeout=None)
    except Exception:  # noqa: BLE001 - advisory
        log.warning("could not publish the ETA band", exc_info=True)
    return band


def current_calibration() -> EtaCalibration:
    """The published calibration as a ready-to-use object (the default band when none)."""
    try:
        band = cache.get(BAND_KEY)
    except Exception:  # noqa: BLE001 - pages must render without Redis
        band = None
    return _Published(band) if band else EtaCalibration()


class _Published(EtaCalibration):
    """A calibration whose bounds were computed by the cycle and read from the cache."""

    def __init__(self, band: Mapping[str, Any]) -> None:
        super().__init__()
        self._published = (float(band["lo"]), float(band["hi"]))
        self._is_calibrated = bool(band.get("calibrated"))
        self._count = int(band.get("samples", 0))

    @property
    def samples(self) -> int:
        return self._count

    @property
    def calibrated(self) -> bool:
        return self._is_calibrated

    def log_bounds(self) -> tuple[float, float]:
        return self._published


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
