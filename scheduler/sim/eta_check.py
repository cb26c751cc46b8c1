"""How good the ETAs a policy's queue shows are: replay a trace, forecast each job's start
the first time it waits in a cycle (what its owner sees right after submitting), and compare
with when it really started.

`EtaDriver` drives a production policy exactly as `PolicyDriver` does and, in every cycle
where a job waits for the first time, runs the production forecast
(`scheduler.core.eta.estimate`, predicted runtimes as the simulator's predictor gives them)
and the production band (`scheduler.core.eta_band.EtaCalibration`, learned online from the
jobs that started before, as production learns it). `eta_metrics` then reports:

- `eta_jobs`: jobs forecast; `eta_none_share`: of those, the share with no ETA (beyond the
  forecast's window);
- `eta_median_abs_error_share`: median of |forecast start - actual start| / actual wait over
  jobs that waited at least one cycle interval (jobs that start at once are trivially right
  and would flatter the figure); `eta_p90_abs_error_share` likewise;
- `eta_band_coverage`: share of those jobs whose actual start fell inside the 80% band given
  with the forecast; `eta_band_calibrated_share`: how many bands came from a learned
  calibration rather than the default;
- `eta_median_abs_error_s`: the same error in seconds, over every forecast job.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from scheduler.core.eta import estimate
from scheduler.core.eta_band import EtaCalibration
from scheduler.sim.engine import PolicyDriver, SimResult, apply_plan
from scheduler.sim.state import SimState


class EtaDriver(PolicyDriver):
    # No cycle is skipped (see engine.skip_rules): production runs one on every submit, and
    # a forecast is made in the first cycle a job waits.
    may_preempt = None  # type: ignore[assignment]

    def __init__(self, policy: Any, calibration: EtaCalibration | None = None):
        super().__init__(policy)
        self.calibration = calibration or EtaCalibration()
        # job id -> (forecast at, forecast start or None, band low, band high, calibrated)
        self.forecasts: dict[int, tuple[float, float | None, float, float, bool]] = {}
        self._open: set[int] = set()  # forecast, not started yet
        self.forecast_seconds = 0.0

    def cycle(self, state: SimState) -> int:
        self._learn(state)
        snap = state.snapshot()
        plan = self.policy.schedule(snap)
        self.cycles += 1
        fresh = [j.id for j in snap.pending if j.id not in self.forecasts]
        if fresh:
            t0 = time.perf_counter()
            forecast = estimate(snap, self.policy, plan=plan)
            self.forecast_seconds += time.perf_counter() - t0
            calibrated = self.calibration.calibrated
            for job_id in fresh:
                _, eta, _ = forecast.get(job_id, (0, None, ""))
                if eta is None:
                    self.forecasts[job_id] = (state.now, None, math.nan, math.nan, calibrated)
                else:
                    low, high = (
                        (eta, eta) if eta <= state.now else (self.calibration.band(state.now, eta))
                    )
                    self.forecasts[job_id] = (state.now, eta, low, high, calibrated)
                self._open.add(job_id)
        return apply_plan(state, plan)

    def _learn(self, state: SimState) -> None:
        """Feed the calibration with the jobs that started since the last cycle."""
        started = [i for i in self._open if state.jobs[i].first_start is not None]
        for job_id in started:
            self._open.discard(job_id)
            at, eta, _, _, _ = self.forecasts[job_id]
            first = state.jobs[job_id].first_start
            # Only forecasts of a wait teach the band: a job forecast to start now is placed
            # by the very plan that forecast it, so its band is that instant.
            if eta is not None and first is not None and eta > at:
                self.calibration.observe(eta - at, first - at)


def eta_metrics(result: SimResult, driver: EtaDriver, min_wait: float = 60.0) -> dict[str, Any]:
    errors_share, errors_s, inside, calibrated = [], [], [], []
    none = 0
    for job_id, (at, eta, low, high, cal) in driver.forecasts.items():
        first = result.state.jobs[job_id].first_start
        if first is None:
            continue
        if eta is None:
            none += 1
            continue
        errors_s.append(abs(eta - first))
        wait = first - at
        if wait >= min_wait:
            errors_share.append(abs(eta - first) / wait)
            inside.append(low <= first <= high)
            calibrated.append(cal)
    total = len(driver.forecasts)

    def pct(values: list[float], q: float) -> float:
        return float(np.percentile(values, q)) if values else math.nan

    return {
        "eta_jobs": total,
        "eta_none_share": none / total if total else math.nan,
        "eta_waited": len(errors_share),
        "eta_median_abs_error_share": pct(errors_share, 50),
        "eta_p90_abs_error_share": pct(errors_share, 90),
        "eta_median_abs_error_s": pct(errors_s, 50),
        "eta_band_coverage": float(np.mean(inside)) if inside else math.nan,
        "eta_band_calibrated_share": float(np.mean(calibrated)) if calibrated else math.nan,
        "eta_forecast_seconds": driver.forecast_seconds,
    }
