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
`window` ratios. If forecasts err as they did lately, 80% of starts fall inside. PAD (one
scheduling minute) keeps jobs that start at once from dominating the ratios.

Until `min_samples` outcomes are known the band is DEFAULT_BAND (half to twice the
forecast wait), which says plainly that it is not yet learned (`calibrated` false).
Pure and incremental: production and the simulator use the same object.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

PAD_S = 60.0
DEFAULT_BAND = (math.log(0.5), math.log(2.0))
LOW_Q, HIGH_Q = 0.10, 0.90


class EtaCalibration:
    def __init__(self, window: int = 500, min_samples: int = 20) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError("window and min_samples must be at least 1")
        self.window = window
        self.min_samples = min_samples
        self._ratios: deque[float] = deque(maxlen=window)
        self._bounds: tuple[float, float] | None = None

    @classmethod
    def from_outcomes(
        cls, outcomes: Iterable[tuple[float, float]], **params: int
    ) -> EtaCalibration:
        """From (forecast wait, actual wait) pairs, oldest first."""
        calibration = cls(**params)
        for forecast, actual in outcomes:
            calibration.observe(forecast, actual)
        return calibration

    def observe(self, forecast_wait: float, actual_wait: float) -> None:
        """Learn from one job that started: the wait forecast for it and the wait it had."""
        if not (math.isfinite(forecast_wait) and math.isfinite(actual_wait)):
            return
        self._ratios.append(
            math.log((max(actual_wait, 0.0) + PAD_S) / (max(forecast_wait, 0.0) + PAD_S))
        )
        self._bounds = None

    @property
    def samples(self) -> int:
        return len(self._ratios)

    @property
    def calibrated(self) -> bool:
        return len(self._ratios) >= self.min_samples

    def log_bounds(self) -> tuple[float, float]:
        if not self.calibrated:
            return DEFAULT_BAND
        if self._bounds is None:
            ordered = sorted(self._ratios)
            self._bounds = (_quantile(ordered, LOW_Q), _quantile(ordered, HIGH_Q))
        return self._bounds

    def band(self, now: float, eta: float) -> tuple[float, float]:
        """(earliest, latest) start of the 80% band for a job forecast at `now` to start at
        `eta`; never before now, and always around the forecast itself."""
        wait = max(eta - now, 0.0)
        lo, hi = self.log_bounds()
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
