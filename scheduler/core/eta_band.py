"""How far to trust an ETA: an 80% band learned from how earlier forecasts turned out.

The forecast (`scheduler.core.eta.estimate`) plays the queue forward with predicted
runtimes, so it is a point estimate; how wrong such forecasts are depends on this fleet (how
well runtimes are predicted, how often new work jumps the queue, preemptions). Rather than
model every source of error, the band is calibrated on outcomes, as split conformal
prediction does: for every job that started, the ratio of the wait it really had to the wait
forecast for it, on a log scale,

    r = log((actual wait + PAD) / (forecast wait + PAD)),

and the band of a new forecast of wait w is (w + PAD) * exp(q_lo) - PAD to
(w + PAD) * exp(q_hi) - PAD, with q_lo and q_hi the 10th and 90th percentiles of the last
`window` ratios of forecasts of about the same wait (BUCKETS: under a minute, under 15
minutes, under 3 hours, longer; the pooled ratios while a bucket has fewer than
`min_samples`). If forecasts err as they did lately, 80% of starts fall inside. PAD (one
scheduling minute) keeps jobs that start at once from dominating the ratios. Buckets matter:
a forecast of "any moment now" (a running job is past its predicted end) errs differently
from a forecast of hours.

Waits are not exchangeable over time (a burst of arrivals delays everything forecast just
before it), so fixed percentiles of past ratios cover less than they promise when the queue
changes. The quantile level therefore adapts online as in adaptive conformal inference
(Gibbs and Candes, NeurIPS 2021): after each outcome, the miss rate aimed at moves by
`step` x (0.2 - missed), so misses widen the band and hits narrow it back, and over any long
run the share of starts inside approaches 80% whatever the drift. Hits narrow it no further
than the learned 80% percentiles (`max_miss`, default 0.2): starts come in bursts of one
regime (a queue drains, dozens of jobs start inside their bands), and letting a burst of
hits aim at a 30-55% band left the next regime's forecasts with a sliver of a band (on the
recipe, coverage 61-64% against 83% with the limit).

The starts alone arrive late and biased: at any moment the outcomes known are those of jobs
that started, so forecasts that run late teach the band only hours after every forecast of
the same regime has been shown. The jobs still waiting on their forecasts (`censor`) are
therefore counted too, each as a right-censored ratio (it waited at least this long), and
the percentiles are those of the Kaplan-Meier estimate over starts and waiting jobs
together: a job found waiting past its forecast widens the upper end within a cycle, not
when it finally starts. Where too few have started to reach the upper percentile, the band
reaches the longest wait still running.

Whatever the percentiles, a learned band reaches at least `min_reach` (0.2 on the log scale:
a fifth of the padded wait, 1.22x) on each side of the forecast. The direction of the
error flips between regimes faster than any outcome shows it: after a stretch of early
starts the percentiles put the whole band before the forecast, and a submission wave
forecast just then starts a little late, every job of it outside (on the recipe, 8x8
window 40000 priority, coverage 64.9% without the floor, 76.1% with it).

Submission waves after a quiet stretch need more. The quiet stretch teaches the band that
jobs start on time or early, and every job of the wave is forecast before the first of them
is due, so neither the starts nor the censored waits can widen the band in time: on the
recipe whole waves started after their bands (8x8 window 40000 under gittins: the tenth of
the window's forecasts made as a wave began started at a median 2.4x their padded forecast
wait, two thirds of them after their band). So the
band watches the pace (`pace`): while first forecasts are shown faster than jobs that had
one start (over the last half hour, at least 10 shown and more than twice the starts) and
outnumber the jobs still waiting on older forecasts (the queue was short before: a queue
that stays long, overloaded, learns its band from its own censored waits), the band
reaches at least `wave_reach` (1.0 on
the log scale, 2.7x the padded wait) above the forecast. On the recipe this lifted the
coverage of the four busy windows (40000) from 65.3-76.1% to 72.4-81.6%, and moved no
other window by more than a point (`bench/RESULTS.md`).

Until `min_samples` outcomes are known the band is DEFAULT_BAND (half to twice the
forecast wait), which says plainly that it is not yet learned (`calibrated` false).
Pure and incremental: production and the simulator use the same object.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PAD_S = 60.0
DEFAULT_BAND = (math.log(0.5), math.log(2.0))
MISS = 0.20  # the share of starts the band may miss (an 80% band)
# The least a learned band reaches on each side of the forecast, on the log scale of the
# ratios: (wait + PAD) x 1.22 above and / 1.22 below.
MIN_REACH = 0.2
# While a wave of submissions is on (`pace`), the least the band reaches above the forecast:
# e, 2.7x the padded wait. A wave: over the last WAVE_WINDOW seconds, at least WAVE_MIN first
# forecasts were shown, more than WAVE_RATIO times as many as forecast jobs started, and
# more than the jobs still waiting on older forecasts.
WAVE_REACH = 1.0
WAVE_WINDOW = 1800.0
WAVE_MIN = 10
WAVE_RATIO = 2.0
# Upper edges (seconds of forecast wait) of the buckets ratios are kept in; the last is open.
BUCKETS = (60.0, 900.0, 3 * 3600.0)


def _bucket(wait: float) -> int:
    for i, edge in enumerate(BUCKETS):
        if wait < edge:
            return i
    return len(BUCKETS)


class EtaCalibration:
    def __init__(
        self,
        window: int = 500,
        min_samples: int = 20,
        step: float = 0.05,
        max_miss: float = MISS,
        min_reach: float = MIN_REACH,
        wave_reach: float = WAVE_REACH,
    ) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError("window and min_samples must be at least 1")
        if not 0.0 <= step < 1.0:
            raise ValueError("step must be in [0, 1)")
        if not 0.01 <= max_miss < 1.0:
            raise ValueError("max_miss must be in [0.01, 1)")
        if min_reach < 0 or wave_reach < 0:
            raise ValueError("min_reach and wave_reach must be at least 0")
        self.max_miss = max_miss
        self.wave_reach = wave_reach
        self.wave = False  # a wave of submissions is on (`pace`)
        # (started at, actual wait) of the replayed starts that carry their time.
        self.starts: list[tuple[float, float]] = []
        self.min_reach = min_reach
        self.window = window
        self.min_samples = min_samples
        self.step = step
        # The adapted miss rate each bucket's percentiles are taken at (index -1: pooled).
        self.miss = [MISS] * (len(BUCKETS) + 2)
        self._ratios: deque[float] = deque(maxlen=window)
        self._by_bucket = [deque[float](maxlen=window) for _ in range(len(BUCKETS) + 1)]
        # Ratios the jobs still waiting have already reached (`censor`), pooled and by bucket.
        self._waiting: list[float] = []
        self._waiting_by_bucket: list[list[float]] = [[] for _ in range(len(BUCKETS) + 1)]
        self._bounds: dict[int, tuple[float, float]] = {}
        # Bounds read back from `published()` (a reader's copy: it learns nothing).
        self._fixed: dict[int, tuple[float, float]] | None = None
        self._fixed_samples = 0
        self._fixed_calibrated = False

    @classmethod
    def from_outcomes(cls, outcomes: Iterable[Sequence[Any]], **params: Any) -> EtaCalibration:
        """Replay recorded outcomes, oldest first: (forecast wait, actual wait[, judged[,
        started at]]) for a start, (forecast wait, None) for a job found waiting past its
        band. The starts' times are kept in `starts` (started at, actual wait), for `pace`."""
        calibration = cls(**params)
        for item in outcomes:
            forecast, actual = float(item[0]), item[1]
            if actual is None:
                calibration.observe_overdue(forecast)
            else:
                judged = bool(item[2]) if len(item) > 2 else False
                calibration.observe(forecast, float(actual), judged=judged)
                if len(item) > 3:
                    calibration.starts.append((float(item[3]), float(actual)))
        return calibration

    def published(self) -> dict[str, Any]:
        """Plain JSON with what a reader needs to give bands (`from_published`)."""
        keys = [-1, *range(len(BUCKETS) + 1)]
        return {
            "samples": self.samples,
            "calibrated": self.calibrated,
            "wave": self.wave,
            "bounds": {str(k): list(self._bounds_at(k)) for k in keys if self._usable(k)},
        }

    @classmethod
    def from_published(cls, data: Mapping[str, Any]) -> EtaCalibration:
        calibration = cls()
        bounds = data.get("bounds") or {}
        calibration._fixed = {int(k): (float(v[0]), float(v[1])) for k, v in bounds.items()}
        calibration._fixed_samples = int(data.get("samples", 0))
        calibration._fixed_calibrated = bool(data.get("calibrated")) and -1 in calibration._fixed
        calibration.wave = bool(data.get("wave"))
        return calibration

    def observe(self, forecast_wait: float, actual_wait: float, *, judged: bool = False) -> None:
        """Learn from one job that started: the wait forecast for it and the wait it had.
        `judged`: its miss was already counted by `observe_overdue`."""
        if self._fixed is not None:
            raise TypeError("a published calibration is read-only")
        if not (math.isfinite(forecast_wait) and math.isfinite(actual_wait)):
            return
        forecast_wait = max(forecast_wait, 0.0)
        ratio = math.log((max(actual_wait, 0.0) + PAD_S) / (forecast_wait + PAD_S))
        if not judged:
            lo, hi = self.log_bounds(forecast_wait)
            self._adapt(forecast_wait, not (min(lo, 0.0) <= ratio <= max(hi, 0.0)))
        self._ratios.append(ratio)
        self._by_bucket[_bucket(forecast_wait)].append(ratio)
        self._bounds = {}

    def censor(self, waiting: Iterable[tuple[float, float]]) -> None:
        """The jobs still waiting on their forecasts, as (forecast wait, seconds waited so
        far): each counts as a ratio of at least what it has reached. Replaces the set given
        before (call it each cycle with every job still waiting)."""
        if self._fixed is not None:
            raise TypeError("a published calibration is read-only")
        self._waiting = []
        self._waiting_by_bucket = [[] for _ in range(len(BUCKETS) + 1)]
        for forecast_wait, waited in waiting:
            if not (math.isfinite(forecast_wait) and math.isfinite(waited)):
                continue
            forecast_wait = max(forecast_wait, 0.0)
            ratio = math.log((max(waited, 0.0) + PAD_S) / (forecast_wait + PAD_S))
            self._waiting.append(ratio)
            self._waiting_by_bucket[_bucket(forecast_wait)].append(ratio)
        self._bounds = {}

    def overdue(self, forecast_wait: float, waited: float) -> bool:
        """Whether a job still waiting after `waited` seconds is past its band's end."""
        forecast_wait = max(forecast_wait, 0.0)
        _, hi = self.log_bounds(forecast_wait)
        return waited > (forecast_wait + PAD_S) * math.exp(max(hi, 0.0)) - PAD_S

    def observe_overdue(self, forecast_wait: float) -> None:
        """Count a miss as soon as it is certain (the job waits past its band's end), not
        when the job finally starts: otherwise the outcomes known at any moment are biased
        toward jobs that started early, and the band stays too narrow while a queue grows."""
        if math.isfinite(forecast_wait):
            self._adapt(max(forecast_wait, 0.0), True)

    def _adapt(self, forecast_wait: float, missed: bool) -> None:
        if not self.calibrated or self.step <= 0:
            return
        key = self._key(forecast_wait)
        self.miss[key] = min(max(self.miss[key] + self.step * (MISS - missed), 0.01), self.max_miss)
        self._bounds.pop(key, None)

    @property
    def samples(self) -> int:
        return self._fixed_samples if self._fixed is not None else len(self._ratios)

    @property
    def calibrated(self) -> bool:
        if self._fixed is not None:
            return self._fixed_calibrated
        return len(self._ratios) >= self.min_samples

    def log_bounds(self, wait: float | None = None) -> tuple[float, float]:
        """(q_lo, q_hi) for a forecast of this wait (pooled over every wait when None)."""
        if not self.calibrated:
            return DEFAULT_BAND
        lo, hi = self._bounds_at(-1 if wait is None else self._key(wait))
        reach = max(self.wave_reach, self.min_reach) if self.wave else self.min_reach
        return min(lo, -self.min_reach), max(hi, reach)

    def pace(self, shown: int, started: int, older: int = 0) -> None:
        """How many first forecasts were shown, and how many jobs that had one started, over
        the last `WAVE_WINDOW` seconds, and how many jobs still wait on first forecasts shown
        before that (`older`). A wave is on while forecasts outpace starts (at least
        `WAVE_MIN` shown, more than `WAVE_RATIO` times the starts) after a quiet stretch
        (more shown than the older forecasts still waiting: a queue that stays long learns
        its band from its own censored waits), and then the band reaches at least
        `wave_reach` above the forecast."""
        self.wave = shown >= WAVE_MIN and shown > WAVE_RATIO * started and shown > older

    def _usable(self, key: int) -> bool:
        return self.calibrated and (key < 0 or len(self._by_bucket[key]) >= self.min_samples)

    def _bounds_at(self, key: int) -> tuple[float, float]:
        if self._fixed is not None:
            return self._fixed.get(key) or self._fixed.get(-1) or DEFAULT_BAND
        bounds = self._bounds.get(key)
        if bounds is None:
            ordered = sorted(self._ratios if key < 0 else self._by_bucket[key])
            waiting = self._waiting if key < 0 else self._waiting_by_bucket[key]
            half = self.miss[key] / 2
            if waiting:
                bounds = _km_quantiles(ordered, sorted(waiting), half, 1 - half)
            else:
                bounds = (_quantile(ordered, half), _quantile(ordered, 1 - half))
            self._bounds[key] = bounds
        return bounds

    def _key(self, wait: float) -> int:
        """The bucket of a forecast wait, or -1 (pooled) while that bucket has too few."""
        key = _bucket(max(wait, 0.0))
        if self._fixed is not None:
            return key if key in self._fixed else -1
        return key if len(self._by_bucket[key]) >= self.min_samples else -1

    def band(self, now: float, eta: float) -> tuple[float, float]:
        """(earliest, latest) start of the 80% band for a job forecast at `now` to start at
        `eta`; never before now, and always around the forecast itself."""
        wait = max(eta - now, 0.0)
        lo, hi = self.log_bounds(wait)
        low = now + max((wait + PAD_S) * math.exp(lo) - PAD_S, 0.0)
        high = now + max((wait + PAD_S) * math.exp(hi) - PAD_S, 0.0)
        return min(low, eta), max(high, eta)


def _quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolated quantile of a sorted, non-empty list."""
    pos = q * (len(ordered) - 1)
    i = int(pos)
    if i + 1 >= len(ordered):
        return ordered[-1]
    return ordered[i] + (ordered[i + 1] - ordered[i]) * (pos - i)


def _km_quantiles(
    started: list[float], waiting: list[float], low: float, high: float
) -> tuple[float, float]:
    """The `low` and `high` quantiles of the Kaplan-Meier estimate over exact ratios
    (`started`) and right-censored ones (`waiting`, each a lower bound), both sorted. A
    censored ratio equal to an exact one is still at risk at it. Where the estimate never
    reaches a level (too many still waiting beyond every start), the largest ratio reached."""
    at_risk = len(started) + len(waiting)
    survive = 1.0
    found: list[float] = []
    levels = (low, high)
    i = j = 0
    while i < len(started) and len(found) < 2:
        if j < len(waiting) and waiting[j] < started[i]:
            at_risk -= 1
            j += 1
            continue
        survive *= 1.0 - 1.0 / at_risk
        at_risk -= 1
        while len(found) < 2 and 1.0 - survive >= levels[len(found)] - 1e-12:
            found.append(started[i])
        i += 1
    top = max(started[-1] if started else -math.inf, waiting[-1] if waiting else -math.inf)
    while len(found) < 2:
        found.append(top)
    return found[0], found[1]
