"""The ETA forecast: after a cycle, outside the scheduler lock.

A forecast plays the cycle's plan forward over every waiting job (scheduler.core.eta): on a
long queue it costs more than the rest of a cycle (0.5-1 s for 10,000 jobs). A cycle decides
whether one is due (`forecast_due`) and, once it has applied its plan, written the waits and
released the lock, the same task runs it on that cycle's snapshot and plan
(`forecast_after`), so a burst's cycle and the next one never wait for it.

The forecast is still the one source of ETAs: cycles between forecasts carry each stored
ETA over (`scheduler.cycle.runner.plan_estimates`), and a forecast writes only ETAs, only
where they changed, and only to rows no one wrote since the cycle it follows (fenced on
the row versions that cycle left on PostgreSQL, elsewhere on the job still pending on the
same attempt with the ETA that cycle left), so it never writes over a newer cycle's or a
newer forecast's state. It is recorded as done (`eta_ms` in the cycle's record) only once
written: a worker killed in between leaves the next cycle to forecast again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from time import perf_counter
from typing import Any

from django.db import connection

from fleet.models import Job, JobState
from scheduler.core.eta import estimate
from scheduler.core.model import Plan
from scheduler.cycle.eta_learning import follow_forecasts, refresh_band
from scheduler.cycle.snapshot import DbSnapshot
from scheduler.cycle.snapshot_rows import (
    KEPT,
    WAIT_POSITION,
    WAIT_REASON,
    wait_versions,
    waits_written,
)
from scheduler.models import CycleRecord
from scheduler.policies import Policy

log = logging.getLogger(__name__)

# A job waiting for the first time is forecast within this many seconds, not only every
# "eta_interval": soon enough that its owner sees an ETA, rare enough that a steady stream
# of submits does not put a forecast (the costliest part on a long queue) after every cycle.
NEW_JOB_FORECAST_GAP_S = 5.0


def forecast_due(snap: DbSnapshot) -> bool:
    """Whether a forecast follows this cycle: at most every "eta_interval" seconds, and
    sooner (once NEW_JOB_FORECAST_GAP_S have passed) when a job was submitted since the
    last forecast, so that nobody waits long without one."""
    interval = float(snap.param("eta_interval"))
    if interval <= 0:
        return True
    last = (
        CycleRecord.objects.filter(timings__has_key="eta_ms")
        .order_by("-id")
        .values_list("started_at", flat=True)
        .first()
    )
    if last is None:
        return True
    age = (snap.now - last).total_seconds()
    if age >= interval:
        return True
    if age < min(interval, NEW_JOB_FORECAST_GAP_S):
        return False
    since = last.timestamp()
    return any(job.submitted_at > since for job in snap.core.pending)


def estimates_for(snap: DbSnapshot, policy: Policy, plan: Plan) -> dict[int, Any]:
    """job id -> (position, ETA, reason) for every pending job, by playing the plan forward.
    Reasons are the plan's, worded the same whether or not ETAs were forecast."""
    forecast = estimate(
        snap.core,
        policy,
        plan=plan,
        max_events=int(snap.param("eta_max_events")),
        horizon=float(snap.param("eta_horizon")),
    )
    reasons = {w.job_id: w.reason for w in plan.waits}
    return {
        job_id: (position, eta, reasons.get(job_id, reason))
        for job_id, (position, eta, reason) in forecast.items()
    }


@dataclass
class Forecast:
    """What the forecast after a cycle needs: that cycle's snapshot, policy and plan, the
    jobs it started, the ETA (whole seconds) it left on each waiting job, its record, and
    (on PostgreSQL, where the cycle kept its rows) the version it left each waiting row at."""

    snap: DbSnapshot
    policy: Policy
    plan: Plan
    placed: set[int]
    left: dict[int, int | None]
    record: CycleRecord
    versions: dict[int, str] | None = None

    def __post_init__(self) -> None:
        if self.versions is None and connection.vendor == "postgresql":
            ids = list(self.left)
            found = wait_versions(ids)
            if found is not None:
                self.versions = dict(zip(ids, found, strict=True))


def forecast_after(forecast: Forecast) -> int:
    """Forecast the waiting jobs' ETAs and write those that changed (fenced, see the module
    docstring); returns the rows written. Runs after the cycle released the lock."""
    t0 = perf_counter()
    snap = forecast.snap
    written = 0
    try:
        estimates = estimates_for(snap, forecast.policy, forecast.plan)
        waiting = {k: v for k, v in estimates.items() if k not in forecast.placed}
        horizon = float(snap.param("eta_horizon"))
        submitted = {j.id: j.submitted_at for j in snap.core.pending}
        follow_forecasts(snap.core.now, waiting, horizon, refresh_band(), submitted)
        etas: dict[int, int | None] = {}
        for job_id, (_, eta, _) in waiting.items():
            whole = None if eta is None else int(eta)
            if job_id in forecast.left and forecast.left[job_id] != whole:
                etas[job_id] = whole
        written = write_etas(forecast, etas)
    except Exception:  # a failed forecast leaves the ETAs as they were; scheduling goes on
        log.exception("the ETA forecast after cycle %s failed", forecast.record.pk)
    record = forecast.record
    record.timings = {
        **record.timings,
        "eta_ms": round((perf_counter() - t0) * 1000, 1),
        "etas_written": written,
    }
    CycleRecord.objects.filter(pk=record.pk).update(timings=record.timings)
    return written


def write_etas(forecast: Forecast, etas: dict[int, int | None]) -> int:
    """Write new ETAs (job id -> whole seconds) to rows still as the cycle left them."""
    if not etas:
        return 0
    ids = list(etas)
    at = [None if etas[i] is None else datetime.fromtimestamp(etas[i], tz=UTC) for i in ids]  # type: ignore[arg-type]
    if forecast.versions is not None:
        versions = [forecast.versions[i] for i in ids]
        return _write_versioned(ids, at, versions)
    left, attempts = forecast.left, forecast.snap.attempts
    written = 0
    for job_id, eta in zip(ids, at, strict=True):
        before = left[job_id]
        # The cycle compared and left ETAs in whole seconds.
        fence: dict[str, Any] = {"eta__isnull": True}
        if before is not None:
            fence = {
                "eta__gte": datetime.fromtimestamp(before, tz=UTC),
                "eta__lt": datetime.fromtimestamp(before + 1, tz=UTC),
            }
        written += Job.objects.filter(
            id=job_id, state=JobState.PENDING, attempt=attempts[job_id], **fence
        ).update(eta=eta)
    return written


def _write_versioned(ids: list[int], at: list[datetime | None], versions: list[str]) -> int:
    """One UPDATE over arrays, only to rows at the version the cycle left; the new versions
    are kept, so the next snapshot does not read these rows again."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Job._meta.db_table} AS j SET eta = v.eta "
            "FROM unnest(%s::bigint[], %s::timestamptz[], %s::text[]) AS v(id, eta, version) "
            "WHERE j.id = v.id AND j.state = %s AND j.xmin::text = v.version "
            "RETURNING j.id, j.xmin::text",
            [ids, at, versions, JobState.PENDING.value],
        )
        done = dict(cursor.fetchall())
    kept = []
    for job_id, eta in zip(ids, at, strict=True):
        version = done.get(job_id)
        row = KEPT.pending.get(job_id)
        if version is not None and row is not None:
            seconds = None if eta is None else eta.timestamp()
            kept.append((job_id, version, row[WAIT_REASON], row[WAIT_POSITION], seconds))
    waits_written(kept)
    return len(done)
