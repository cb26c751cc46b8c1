"""Advisor runs: start one (one at a time per fleet), execute it in the control worker with
its progress in the cache, read it, and apply a candidate's policy and weights.

A run lives in the cache (Redis) under its id for a day, as JSON: state (queued, running,
done, failed), done/total candidates, the "what happened" metrics and each candidate's.
Losing Redis loses only advisor runs, never scheduler state (docs/design.md, rule 1).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from fleet.errors import ApplicationError, Conflict, NotFound
from scheduler.advisor import history
from scheduler.advisor.evaluate import evaluate
from scheduler.advisor.grid import MAX_CANDIDATES, candidates
from scheduler.advisor.records import actual_metrics, trace_rows
from scheduler.cycle.config import SETTINGS_PK, known_params, settings_get, settings_update
from scheduler.models import SchedulerSettings
from scheduler.policies import policy_names

log = logging.getLogger(__name__)

RUN_KEY = "advisor:run:{id}"
RUN_ID = re.compile(r"[0-9a-f]{16}")
ACTIVE_KEY = "advisor:active"
LATEST_KEY = "advisor:latest"
RESULT_TTL = 86400
# The task's hard time limit is RUN_TIME_LIMIT; the guard outlives it a little, so a worker
# killed mid-run frees the advisor by itself.
RUN_TIME_LIMIT = 3600
# Candidates start only within this budget, which leaves the last one a quarter of an hour
# before the task's soft limit (an overrun is reported as that candidate's error).
SIM_BUDGET = 45 * 60
ACTIVE_TTL = RUN_TIME_LIMIT + 300
# A run still queued this long after it was started is taken for lost (no control worker
# was there to take it): the next start replaces it instead of waiting for ACTIVE_TTL.
QUEUE_GRACE_S = 600
METRICS = ("wait_avg", "wait_p95", "jct_avg", "utilization", "fairness_jain", "preemptions_per_job")
# Which way is better per metric (the page highlights the best of each column).
HIGHER_IS_BETTER = frozenset({"utilization", "fairness_jain"})


def _key(run_id: str) -> str:
    return RUN_KEY.format(id=run_id)


def _save(run: dict[str, Any]) -> None:
    cache.set(_key(run["id"]), json.dumps(run), timeout=RESULT_TTL)


def _load(run_id: str) -> dict[str, Any] | None:
    text = cache.get(_key(run_id))
    return None if text is None else json.loads(text)


def advisor_run_start(*, user: Any, days: Any, now: datetime | None = None) -> dict[str, Any]:
    """Check the request, take the one-run guard and queue the run on the control worker."""
    from scheduler.tasks import advisor_run

    days = history.check_days(days)
    now = now or timezone.now()
    count = history.check_job_count(days=days, now=now)
    cluster = history.fleet_cluster()  # refuses a fleet without GPUs now, not in the worker
    run_id = secrets.token_hex(8)
    if not cache.add(ACTIVE_KEY, run_id, timeout=ACTIVE_TTL) and not (
        _drop_unstarted(now) and cache.add(ACTIVE_KEY, run_id, timeout=ACTIVE_TTL)
    ):
        other = cache.get(ACTIVE_KEY)
        raise Conflict(
            f"An advisor run ({other}) is already in progress; one runs at a time. Wait for "
            "it to finish, or open it to follow its progress.",
            {"run": other},
        )
    row = settings_get()
    run = {
        "id": run_id,
        "state": "queued",
        "days": days,
        "jobs_in_window": count,
        "created_at": now.isoformat(),
        "created_by": user.get_username() if user is not None else "",
        "cluster": cluster.spec.text,
        "policy": row.policy,
        "params": dict(row.params or {}),
        "settings_seen": row.updated_at.isoformat(),
        "done": 0,
        "total": 0,
        "actual": None,
        "candidates": [],
        "notes": [],
        "error": "",
        "applied": None,
    }
    _save(run)
    cache.set(LATEST_KEY, run_id, timeout=RESULT_TTL)
    try:
        advisor_run.apply_async(kwargs={"run_id": run_id})
    except Exception:
        _release(run_id)
        cache.delete(_key(run_id))
        raise
    return run


def _drop_unstarted(now: datetime) -> bool:
    """Free the one-run guard of a run no control worker took within QUEUE_GRACE_S (none
    was running, or its message was lost): that run is marked failed, saying why. True
    when the guard was freed."""
    other = cache.get(ACTIVE_KEY)
    if not isinstance(other, str):
        return other is None
    run = _load(other)
    if run is not None:
        waited = (now - datetime.fromisoformat(run["created_at"])).total_seconds()
        if run["state"] != "queued" or waited < QUEUE_GRACE_S:
            return False
        run.update(
            state="failed",
            error=f"No control worker took this run within {QUEUE_GRACE_S // 60} minutes "
            "(is the control worker running?); a new run was started in its place.",
            finished_at=now.isoformat(),
        )
        _save(run)
    _release(other)
    return True


def advisor_run_get(*, run_id: str) -> dict[str, Any]:
    run = _load(run_id) if isinstance(run_id, str) and RUN_ID.fullmatch(run_id) else None
    if run is None:
        raise NotFound(f"No advisor run {run_id}: runs are kept for a day. Start a new one.")
    return run


def advisor_run_latest() -> dict[str, Any] | None:
    """The run started last, while the cache keeps it."""
    run_id = cache.get(LATEST_KEY)
    return _load(run_id) if isinstance(run_id, str) else None


def _release(run_id: str) -> None:
    if cache.get(ACTIVE_KEY) == run_id:
        cache.delete(ACTIVE_KEY)


def advisor_run_execute(*, run_id: str) -> dict[str, Any] | None:
    """Simulate the run's window under every candidate, saving progress after each."""
    run = _load(run_id)
    if run is None or run["state"] != "queued":
        return None  # expired, or a redelivered message for a run already taken
    try:
        run["state"] = "running"
        _save(run)
        now = datetime.fromisoformat(run["created_at"])
        export = history.recorded_jobs(days=run["days"], now=now)
        cluster = history.fleet_cluster()
        cands = candidates(policy_names(), known_params(), cap=MAX_CANDIDATES)
        run["total"] = len(cands)
        run["notes"] = export.notes
        run["actual"] = {
            "label": "what happened",
            "metrics": actual_metrics(export.jobs, cluster.spec.total_gpus).as_dict(),
        }
        _save(run)
        if not export.jobs:
            run["notes"].append(
                f"No job submitted in the last {run['days']} days has run yet: nothing to replay."
            )
        else:

            def progress(done: int) -> None:
                run["done"] = done
                _save(run)

            run["candidates"] = evaluate(
                trace_rows(export.jobs),
                cluster.spec,
                cands,
                settings=run["params"],
                guarantees=cluster.guarantees,
                cycle_interval=float(settings_get().tick_seconds),
                progress=progress,
                budget=SIM_BUDGET,
            )
        run["done"] = run["total"]
        run["best"] = best_per_metric(run)
        run["state"] = "done"
    except ApplicationError as exc:
        run.update(state="failed", error=exc.message)
    except Exception as exc:
        log.exception("advisor run %s failed", run_id)
        run.update(state="failed", error=f"The run failed: {type(exc).__name__}: {exc}")
    finally:
        run["finished_at"] = timezone.now().isoformat()
        _save(run)
        _release(run_id)
    return run


def best_per_metric(run: dict[str, Any]) -> dict[str, list[str]]:
    """Per metric, the rows (\"actual\" or candidate indexes as text) with the best value."""
    rows: list[tuple[str, dict[str, Any]]] = []
    if run.get("actual"):
        rows.append(("actual", run["actual"]["metrics"]))
    rows += [(str(c["index"]), c["metrics"]) for c in run.get("candidates", []) if "metrics" in c]
    best: dict[str, list[str]] = {}
    for metric in METRICS:
        values = [(k, float(m[metric])) for k, m in rows if m.get(metric) is not None]
        if not values:
            continue
        numbers = [v for _, v in values]
        target = max(numbers) if metric in HIGHER_IS_BETTER else min(numbers)
        best[metric] = [k for k, v in values if abs(v - target) <= 1e-9 * max(1.0, abs(target))]
    return best


def advisor_run_apply(*, run_id: str, candidate: Any, user: Any) -> SchedulerSettings:
    """Make a candidate's policy and parameter overrides the scheduler's settings.

    The run compared candidates against the settings it saw when it started; if anyone has
    changed them since (the same check as the settings page's), its figures no longer say
    what the change would do, and the apply is refused with a sentence saying so."""
    run = advisor_run_get(run_id=run_id)
    if run["state"] != "done":
        raise Conflict(
            f"Advisor run {run_id} is {run['state']} ({run['done']}/{run['total']} candidates); "
            "apply a candidate once it is done."
        )
    cands = run.get("candidates") or []
    if (
        isinstance(candidate, bool)
        or not isinstance(candidate, int)
        or not (0 <= candidate < len(cands))
    ):
        message = (
            f"candidate must be the index of one of this run's {len(cands)} candidates "
            f"(0 to {len(cands) - 1})."
            if cands
            else "This run has no candidates to apply."
        )
        raise ApplicationError(message, {"fields": {"candidate": [message]}})
    chosen = cands[candidate]
    if "error" in chosen:
        raise ApplicationError(
            f"Candidate {candidate} ({chosen['label']}) failed in the simulator and cannot be "
            f"applied: {chosen['error']}"
        )
    with transaction.atomic():
        row = SchedulerSettings.objects.select_for_update().filter(pk=SETTINGS_PK).first()
        if row is None:
            row = settings_get()
        if row.updated_at.isoformat() != run["settings_seen"]:
            who = row.updated_by or "someone"
            raise Conflict(
                f"{who} changed the scheduler settings at {row.updated_at:%Y-%m-%d %H:%M:%S} "
                "UTC, after this run started, so its figures compare against settings that "
                "no longer hold. Start a new run and apply from it."
            )
        row = settings_update(
            user=user, policy=chosen["policy"], params=chosen["params"], merge_params=True
        )
    run["applied"] = {
        "candidate": candidate,
        "label": chosen["label"],
        "by": user.get_username() if user is not None else "",
        "at": timezone.now().isoformat(),
    }
    _save(run)
    return row
