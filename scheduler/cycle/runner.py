"""The scheduling cycle: lock, snapshot, policy, apply, the waiting jobs' order and reasons
(scheduler.cycle.queue_order), record; then, outside the lock, the ETA forecast when one is
due (scheduler.cycle.forecast).

    from scheduler.cycle.runner import run_cycle
    record = run_cycle()          # None when another cycle holds the lock

The Celery task "scheduler.tasks.schedule_cycle" calls `run_cycle`; beat sends it every
tick and `fleet.services.messaging.request_schedule()` sends it (debounced) on submit,
finish, cancel, hold and node changes.
"""

from __future__ import annotations

import gc
import logging
from datetime import datetime
from time import perf_counter
from typing import Any

from django.utils import timezone

from scheduler.core.model import Plan
from scheduler.cycle.apply import Outcome, apply_plan, clear_stale, waiting_order
from scheduler.cycle.eta_learning import learn_starts
from scheduler.cycle.forecast import Forecast, forecast_after, forecast_due
from scheduler.cycle.lock import cycle_lock
from scheduler.cycle.queue_order import store_waits
from scheduler.cycle.snapshot import DbSnapshot, build_snapshot
from scheduler.models import DEFAULT_POLICY, CycleRecord
from scheduler.policies import Policy, get_policy

log = logging.getLogger(__name__)

# Cycle records kept; older ones are deleted as new ones arrive.
KEEP_CYCLES = 1000


def make_policy(snap: DbSnapshot) -> tuple[Policy, list[str]]:
    """The configured policy, or the default one (with a note) if it cannot be built."""
    try:
        return get_policy(snap.policy, **snap.params), []
    except Exception as exc:  # a bad stored row must not stop scheduling
        log.exception("cannot build policy %s", snap.policy)
        note = f"policy {snap.policy} could not be built ({exc}); used {DEFAULT_POLICY}"
        return get_policy(DEFAULT_POLICY, **snap.params), [note]


def plan_for(snap: DbSnapshot) -> tuple[Policy, Plan, list[str]]:
    """Run the configured policy on the snapshot; fall back to the default policy if the
    configured one fails, so one broken policy never stops the fleet."""
    policy, notes = make_policy(snap)
    try:
        return policy, policy.schedule(snap.core), notes
    except Exception as exc:
        if policy.name == DEFAULT_POLICY:
            raise
        log.exception("policy %s failed", policy.name)
        fallback = get_policy(DEFAULT_POLICY, **snap.params)
        note = f"policy {policy.name} failed ({exc}); used {DEFAULT_POLICY}"
        return fallback, fallback.schedule(snap.core), [*notes, note]


def plan_estimates(snap: DbSnapshot, plan: Plan) -> dict[int, Any]:
    """Positions and reasons from the plan, ETAs as last forecast: what a cycle writes
    between two forecasts. The forecast is the only source of ETAs (a reservation's start,
    computed from time limits, would disagree with it between forecasts)."""
    waits = {w.job_id: w for w in plan.waits}
    now = snap.core.now
    out: dict[int, Any] = {}
    for position, job_id in enumerate(plan.order, start=1):
        wait = waits.get(job_id)
        stored = snap.waits.get(job_id)
        eta = None
        if stored is not None and stored[2] is not None and stored[2] >= now:
            eta = float(stored[2])
        out[job_id] = (position, eta, wait.reason if wait is not None else "")
    return out


def _record(
    *,
    started: datetime,
    t0: float,
    snap: DbSnapshot,
    plan: Plan,
    outcome: Outcome,
    timings: dict[str, float],
    notes: list[str],
) -> CycleRecord:
    skipped = [f"job {job_id}: {why}" for job_id, why in list(outcome.skipped.items())[:20]]
    record = CycleRecord.objects.create(
        started_at=started,
        finished_at=timezone.now(),
        duration_ms=round((perf_counter() - t0) * 1000, 1),
        policy=plan.policy,
        pending=len(snap.core.pending),
        running=len(snap.core.running),
        placed=len(outcome.placed),
        preempted=len(outcome.preempted) + len(outcome.failed),
        reserved=len(plan.reserves),
        skipped=len(outcome.skipped),
        timings={k: round(v, 1) for k, v in timings.items()},
        notes=[*notes, *plan.notes, *skipped],
    )
    CycleRecord.objects.filter(id__lte=record.pk - KEEP_CYCLES).delete()
    return record


def run_cycle_locked(*, now: datetime | None = None) -> tuple[CycleRecord, Forecast | None]:
    """One cycle, and the forecast to run after it (None when none is due); the caller
    holds the scheduler lock."""
    started = timezone.now()
    t0 = perf_counter()
    snap = build_snapshot(now=now)
    t1 = perf_counter()
    policy, plan, notes = plan_for(snap)
    t2 = perf_counter()
    outcome = apply_plan(snap, plan)
    learn_starts(snap.core.now, outcome.placed)
    t3 = perf_counter()
    estimates = plan_estimates(snap, plan)
    order_written = store_waits(waiting_order(estimates, outcome))
    cleared = clear_stale(snap)
    t4 = perf_counter()
    timings = {
        "snapshot_ms": (t1 - t0) * 1000,
        "policy_ms": (t2 - t1) * 1000,
        "apply_ms": (t3 - t2) * 1000,
        "waits_ms": (t4 - t3) * 1000,
        # Job rows the waits wrote: only a position left there or an ETA past, cleared.
        "waits_written": cleared,
        "order_written": int(order_written),
    }
    record = _record(
        started=started,
        t0=t0,
        snap=snap,
        plan=plan,
        outcome=outcome,
        timings=timings,
        notes=notes,
    )
    if not forecast_due(snap):
        return record, None
    placed = set(outcome.placed)
    left = {
        job_id: None if eta is None else int(eta)
        for job_id, (_, eta, _) in estimates.items()
        if job_id not in placed
    }
    return record, Forecast(snap, policy, plan, placed, left, record)


def run_cycle(*, now: datetime | None = None) -> CycleRecord | None:
    """Run one cycle if no other is running, then the ETA forecast if one is due (outside
    the lock, scheduler.cycle.forecast); None when the lock is held elsewhere."""
    # A cycle builds hundreds of thousands of small objects and frees them at the end;
    # the collector's passes over them in between would cost a third of the cycle.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with cycle_lock() as acquired:
            if not acquired:
                log.info("another scheduling cycle is running; this one does nothing")
                return None
            record, forecast = run_cycle_locked(now=now)
        if forecast is not None:
            forecast_after(forecast)
        return record
    finally:
        if collecting:
            gc.enable()
