"""How good the ETAs a policy's queue shows are: replay a trace, forecast each job's start
the first time it waits in a cycle (what its owner sees right after submitting), and compare
with when it really started.

`EtaDriver` drives a production policy exactly as `PolicyDriver` does and, in every cycle
where a job waits for the first time, runs the production forecast
(`scheduler.core.eta.estimate`, predicted runtimes as the simulator's predictor gives them)
and the production band (`scheduler.core.eta_band.EtaCalibration`, learned online from the
jobs that started before, as production learns it, and told each cycle the pace of first
forecasts and starts, `EtaCalibration.pace`). `eta_metrics` then reports:

- `eta_jobs`: jobs forecast; `eta_none_share`: of those, the share with no ETA (beyond the
  forecast's window);
- `eta_median_abs_error_share`: median of |forecast start - actual start| / actual wait over
  jobs that waited at least one cycle interval (jobs that start at once are trivially right
  and would flatter the figure); `eta_p90_abs_error_share` likewise;
- `eta_band_coverage`: share of those jobs whose actual start fell inside the 80% band given
  with the forecast; `eta_band_coverage_all`: the same over every job the band was given for
  (all but those the forecasting plan placed at once); `eta_band_calibrated_share`: how many bands came from a learned
  calibration rather than the default;
- `eta_median_abs_error_s`: the same error in seconds, over every forecast job;
- with `shown_every`, `eta_shown_median_abs_error_share` and `eta_shown_band_coverage`: the
  same over the forecasts every waiting job showed at those cycles (error over the wait
  still ahead from then, jobs with at least a cycle interval of it), `eta_shown_samples`
  how many.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np

from scheduler.core.eta import estimate
from scheduler.core.eta_arrivals import Arrivals
from scheduler.core.eta_band import WAVE_WINDOW, EtaCalibration
from scheduler.core.model import PendingJob, Snapshot
from scheduler.sim.engine import PolicyDriver, SimResult, apply_plan
from scheduler.sim.state import SimState

# The forecast told every job's true runtime (`exact_runtimes`): what no prediction beats.
EXACT = "exact"


def exact_runtimes(snapshot: Snapshot, state: SimState) -> Snapshot:
    """The snapshot with each job's true runtime as its prediction: a waiting job's work
    still to do at full speed (plus its restart overhead), a running job's real end. A forecast on it
    errs only by what it does not play (later submissions, preemptions, reordering), so
    its error is the floor that better runtime predictions alone cannot go below."""
    jobs = state.jobs
    return replace(
        snapshot,
        pending=tuple(
            replace(j, predicted_runtime=jobs[j.id].remaining_work + jobs[j.id].overhead)
            for j in snapshot.pending
        ),
        running=tuple(
            replace(r, predicted_runtime=jobs[r.id].ends_at - r.started_at)
            for r in snapshot.running
        ),
        pending_changes=None,
        running_changes=None,
    )


class EtaDriver(PolicyDriver):
    # No cycle is skipped (see engine.skip_rules): production runs one on every submit, and
    # a forecast is made in the first cycle a job waits.
    may_preempt = None  # type: ignore[assignment]

    def __init__(
        self,
        policy: Any,
        calibration: EtaCalibration | None = None,
        arrivals_window: float = 0.0,
        censored: bool = True,
        shown_every: int = 0,
        runtimes: str | None = None,
        samples: int = 1,
    ):
        """`arrivals_window`: seconds of recent submissions the forecast replays as the
        ones to expect (`scheduler.core.eta_arrivals`); 0 forecasts the queue alone.
        `censored`: the band counts the jobs still waiting on their forecasts
        (`EtaCalibration.censor`), as production does; False: starts alone.
        `shown_every`: every this many cycles, also record the forecast and band every
        waiting job shows then (production forecasts each cycle and a page shows the latest:
        what an owner sees at any time, not only right after submitting); 0: never.
        `runtimes`, `samples`: how the forecast plays runtimes (`scheduler.core.eta_runtimes`;
        None, 1: the policy's, as production plays them; `EXACT`: each job's true runtime,
        see `exact_runtimes`)."""
        super().__init__(policy)
        self.censored = censored
        self.runtimes = runtimes
        self.samples = samples
        self.shown_every = shown_every
        # (job id, at, forecast start, band low, band high) of every waiting job each
        # `shown_every` cycles.
        self.shown: list[tuple[int, float, float, float, float]] = []
        self.calibration = calibration or EtaCalibration()
        self.arrivals_window = arrivals_window
        # Every job as first queued, oldest first (the recent ones are the arrival mix).
        self._submitted: deque[PendingJob] = deque()
        self._seen: set[int] = set()
        # job id -> (forecast at, forecast start or None, band low, band high, calibrated)
        self.forecasts: dict[int, tuple[float, float | None, float, float, bool]] = {}
        self._open: set[int] = set()  # forecast, not started yet
        self._placed: set[int] = set()  # forecast as placed by that very plan
        self._overdue: set[int] = set()  # waiting past their band: the miss is counted
        self.forecast_seconds = 0.0
        self._shown_at: deque[float] = deque()  # when each first forecast with a band was shown
        self._started_at: deque[float] = deque()  # when each forecast job started

    def cycle(self, state: SimState) -> int:
        self._learn(state)
        snap = state.snapshot()
        plan = self.policy.schedule(snap)
        self.cycles += 1
        fresh = [j.id for j in snap.pending if j.id not in self.forecasts]
        for job in snap.pending:
            if job.id not in self._seen:
                self._seen.add(job.id)
                self._submitted.append(job)
        while self._submitted and self._submitted[0].submitted_at <= state.now - max(
            self.arrivals_window, 0.0
        ):
            self._submitted.popleft()
        show = self.shown_every > 0 and self.cycles % self.shown_every == 0
        if fresh or show:
            t0 = time.process_time()
            arrivals = None
            if self.arrivals_window > 0:
                arrivals = Arrivals.from_submissions(
                    state.now, self._submitted, self.arrivals_window
                )
            shown_snap, runtimes = snap, self.runtimes
            if runtimes == EXACT:
                shown_snap, runtimes = exact_runtimes(snap, state), "predicted"
            forecast = estimate(
                shown_snap,
                self.policy,
                plan=plan,
                arrivals=arrivals,
                runtimes=runtimes,
                samples=self.samples,
            )
            self.forecast_seconds += time.process_time() - t0
            calibrated = self.calibration.calibrated
            placed = {p.job_id for p in plan.places}
            self._pace(
                state.now,
                sum(
                    1
                    for j in fresh
                    if j not in placed and forecast.get(j, (0, None))[1] is not None
                ),
            )
            if show:
                for job_id, (_, eta, _) in forecast.items():
                    if eta is not None and job_id not in placed:
                        low, high = self.calibration.band(state.now, max(eta, state.now))
                        self.shown.append((job_id, state.now, eta, low, high))
            for job_id in fresh:
                _, eta, _ = forecast.get(job_id, (0, None, ""))
                if eta is None:
                    self.forecasts[job_id] = (state.now, None, math.nan, math.nan, calibrated)
                else:
                    low, high = (
                        (eta, eta) if job_id in placed else self.calibration.band(state.now, eta)
                    )
                    self.forecasts[job_id] = (state.now, eta, low, high, calibrated)
                self._open.add(job_id)
                if job_id in placed:
                    self._placed.add(job_id)
        else:
            # Production follows the pace every forecast cycle, new jobs or not.
            self._pace(state.now, 0)
        return apply_plan(state, plan)

    def _pace(self, now: float, shown: int) -> None:
        """Tell the band how many first forecasts were shown and how many forecast jobs
        started over the last `WAVE_WINDOW` seconds, these `shown` included."""
        self._shown_at.extend([now] * shown)
        for times in (self._shown_at, self._started_at):
            while times and times[0] <= now - WAVE_WINDOW:
                times.popleft()
        older = sum(
            1
            for job_id in self._open
            if job_id not in self._placed
            and self.forecasts[job_id][1] is not None
            and self.forecasts[job_id][0] <= now - WAVE_WINDOW
        )
        self.calibration.pace(len(self._shown_at), len(self._started_at), older)

    def _learn(self, state: SimState) -> None:
        """Feed the calibration with the jobs that started since the last cycle, and count
        the misses of jobs still waiting past their band (as production does)."""
        for job_id in list(self._open):
            at, eta, _, _, _ = self.forecasts[job_id]
            first = state.jobs[job_id].first_start
            # A job placed by the plan that forecast it has that instant as its band and
            # teaches nothing; every other forecast teaches the band.
            if eta is None or job_id in self._placed:
                if first is not None:
                    self._open.discard(job_id)
                continue
            if first is not None:
                self._open.discard(job_id)
                self._started_at.append(first)
                judged = job_id in self._overdue
                self.calibration.observe(eta - at, first - at, judged=judged)
                self._overdue.discard(job_id)
        waiting = []
        for job_id in self._open:
            at, eta, _, _, _ = self.forecasts[job_id]
            if eta is not None and job_id not in self._placed:
                waiting.append((job_id, at, eta))
        if self.censored:
            self.calibration.censor((eta - at, state.now - at) for _, at, eta in waiting)
        for job_id, at, eta in waiting:
            if job_id not in self._overdue and self.calibration.overdue(eta - at, state.now - at):
                self._overdue.add(job_id)
                self.calibration.observe_overdue(eta - at)


def eta_metrics(result: SimResult, driver: EtaDriver, min_wait: float = 60.0) -> dict[str, Any]:
    errors_share, errors_s, inside, calibrated, inside_all = [], [], [], [], []
    none = 0
    for job_id, (at, eta, low, high, cal) in driver.forecasts.items():
        first = result.state.jobs[job_id].first_start
        if first is None:
            continue
        if eta is None:
            none += 1
            continue
        errors_s.append(abs(eta - first))
        if job_id not in driver._placed:
            inside_all.append(low <= first <= high)
        wait = first - at
        if wait >= min_wait:
            errors_share.append(abs(eta - first) / wait)
            inside.append(low <= first <= high)
            calibrated.append(cal)
    total = len(driver.forecasts)
    shown_errors, shown_inside = [], []
    for job_id, at, eta, low, high in driver.shown:
        first = result.state.jobs[job_id].first_start
        if first is not None and first - at >= min_wait:
            shown_errors.append(abs(eta - first) / (first - at))
            shown_inside.append(low <= first <= high)

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
        "eta_band_coverage_all": float(np.mean(inside_all)) if inside_all else math.nan,
        "eta_band_calibrated_share": float(np.mean(calibrated)) if calibrated else math.nan,
        "eta_forecast_seconds": driver.forecast_seconds,
        "eta_shown_samples": len(shown_errors),
        "eta_shown_median_abs_error_share": pct(shown_errors, 50),
        "eta_shown_band_coverage": float(np.mean(shown_inside)) if shown_inside else math.nan,
    }
