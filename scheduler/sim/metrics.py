"""Metrics of one run, their bounds, and ratios against other runs.

- JCT (finish - submit) and queueing delay (first start - submit): avg, p50, p95, p99.
- Makespan (last finish - first submit) and GPU utilization (GPU-seconds held by jobs, lost
  work included, / (GPUs x makespan)); `useful_utilization` counts only work that finished.
- Preemptions (in all and per job) and lost GPU-seconds and GPU-hours (discarded progress
  plus restart overheads: what restarts cost), and `lost_share`: lost / all GPU-seconds held.
- Multi-node gangs: how many (`gangs`), their avg JCT, `spread_gpu_seconds` (what the gang
  spread slowdown cost), and `gang_wait_share`: GPU-seconds left idle while the oldest waiting
  job was a multi-node gang, / (GPUs x makespan): the share of the cluster's GPU-time lost to
  waiting for gangs to fit.
- Slowdown is bounded slowdown: max(1, JCT / max(runtime, 10 s)), so that a 2-second job
  waiting a minute does not dominate. Jain's index over teams of per-team average slowdown
  (1.0: every team is slowed the same; 1/n: one team takes all the pain).
- Finish-time fairness (Themis): rho = JCT / T_fair, where T_fair is the job's runtime on an
  equal 1/N share of the cluster, N the number of teams with jobs in the system when it was
  submitted: T_fair = max(runtime, 10 s) x max(1, gpus x N / cluster GPUs). rho <= 1 means the job did
  at least as well as on its own share. Reported as avg and max.
- Prediction error: mean absolute relative error |predicted - actual| / actual of the runtime
  predictor on finished jobs it made a prediction for (`prediction_coverage`: how many).
- Bounds: every JCT >= the job's isolated runtime, so avg JCT >= avg runtime; makespan >=
  max(total GPU-seconds / GPUs, max(submit + runtime)).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from scheduler.sim.engine import SimResult

SLOWDOWN_FLOOR_S = 10.0
FINISHED = ("done", "timeout")


def _dist(values: np.ndarray, prefix: str) -> dict[str, float]:
    if values.size == 0:
        return {f"{prefix}_{k}": math.nan for k in ("avg", "p50", "p95", "p99")}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {
        f"{prefix}_avg": float(values.mean()),
        f"{prefix}_p50": float(p50),
        f"{prefix}_p95": float(p95),
        f"{prefix}_p99": float(p99),
    }


def jain(values: list[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n sum x^2); 1.0 when all equal."""
    if not values:
        return math.nan
    s, s2 = sum(values), sum(v * v for v in values)
    return s * s / (len(values) * s2) if s2 > 0 else 1.0


def _contending_teams(runs: list[Any]) -> dict[int, int]:
    """Per job: how many teams had jobs submitted and not yet finished at its submit time."""
    events = []
    for r in runs:
        events.append((r.spec.submit, 1, r.spec.team, r.spec.id))
        end = r.finish if r.finish is not None else math.inf
        events.append((end, 0, r.spec.team, r.spec.id))  # ends sort before arrivals
    events.sort(key=lambda e: (e[0], e[1]))
    active: dict[str, int] = {}
    out: dict[int, int] = {}
    for _, kind, team, job_id in events:
        if kind == 1:
            active[team] = active.get(team, 0) + 1
            out[job_id] = len(active)
        else:
            left = active.get(team, 0) - 1
            if left <= 0:
                active.pop(team, None)
            else:
                active[team] = left
    return out


def compute_metrics(result: SimResult) -> dict[str, Any]:
    state = result.state
    runs = list(state.jobs.values())
    done = [r for r in runs if r.state in FINISHED]
    total_gpus = state.total_gpus
    submit = np.array([r.spec.submit for r in done], dtype=float)
    finish = np.array([r.finish for r in done], dtype=float)
    start = np.array([r.first_start for r in done], dtype=float)
    work = np.array([r.spec.work for r in done], dtype=float)
    gpus = np.array([r.spec.gpu_equivalent for r in done], dtype=float)
    jct = finish - submit
    out: dict[str, Any] = {"policy": result.policy, "jobs": len(runs), "finished": len(done)}
    out["killed"] = sum(r.state == "killed" for r in runs)
    out["rejected"] = sum(r.state == "rejected" for r in runs)
    out["unschedulable"] = sum(r.state == "unschedulable" for r in runs)
    out["timed_out"] = sum(r.state == "timeout" for r in runs)
    out.update(_dist(jct, "jct"))
    out.update(_dist(start - submit, "queue"))

    first_submit = min((r.spec.submit for r in runs), default=0.0)
    ends = [r.finish for r in runs if r.finish is not None]
    makespan = (max(ends) - first_submit) if ends else 0.0
    busy = sum(r.busy_gpu_seconds for r in runs)
    useful = float((work * gpus).sum())
    out["makespan"] = makespan
    out["utilization"] = busy / (total_gpus * makespan) if makespan > 0 else math.nan
    out["useful_utilization"] = useful / (total_gpus * makespan) if makespan > 0 else math.nan
    out["preemptions"] = sum(r.preemptions for r in runs)
    out["preemptions_per_job"] = out["preemptions"] / len(runs) if runs else 0.0
    out["lost_gpu_seconds"] = sum(r.lost_gpu_seconds for r in runs)
    out["lost_gpu_hours"] = out["lost_gpu_seconds"] / 3600.0
    # Lost GPU-hours as a share of all GPU-hours held (lost ones included).
    out["lost_share"] = out["lost_gpu_seconds"] / busy if busy > 0 else 0.0
    out["spread_gpu_seconds"] = sum(r.spread_gpu_seconds for r in runs)
    gangs = [r for r in done if r.spec.nodes > 1]
    out["gangs"] = sum(r.spec.nodes > 1 for r in runs)
    out["gang_jct_avg"] = (
        float(np.mean([(r.finish or 0.0) - r.spec.submit for r in gangs])) if gangs else math.nan
    )
    out["gang_wait_gpu_seconds"] = state.gang_wait_gpu_seconds
    out["gang_wait_share"] = (
        state.gang_wait_gpu_seconds / (total_gpus * makespan) if makespan > 0 else math.nan
    )
    out["busy_gpu_seconds"] = busy
    out["useful_gpu_seconds"] = useful

    slow = np.maximum(1.0, jct / np.maximum(work, SLOWDOWN_FLOOR_S)) if done else np.array([])
    out["slowdown_avg"] = float(slow.mean()) if done else math.nan
    per_team: dict[str, list[float]] = {}
    for r, s in zip(done, slow, strict=True):
        per_team.setdefault(r.spec.team, []).append(float(s))
    team_avg = {t: sum(v) / len(v) for t, v in per_team.items()}
    out["team_slowdown"] = dict(sorted(team_avg.items()))
    out["jain_slowdown"] = jain(list(team_avg.values()))

    n_teams = _contending_teams(runs)
    fair = np.array(
        [
            max(r.spec.work, SLOWDOWN_FLOOR_S)
            * max(1.0, r.spec.gpu_equivalent * n_teams[r.spec.id] / total_gpus)
            for r in done
        ],
        dtype=float,
    )
    rho = jct / np.maximum(fair, 1e-9) if done else np.array([])
    out["ftf_rho_avg"] = float(rho.mean()) if done else math.nan
    out["ftf_rho_max"] = float(rho.max()) if done else math.nan

    errs = [abs(r.predicted - r.spec.work) / r.spec.work for r in done if r.predicted is not None]
    out["prediction_mare"] = float(np.mean(errs)) if errs else None
    out["prediction_coverage"] = len(errs) / len(done) if done else 0.0

    all_work = [r.spec.work for r in runs]
    out["bound_jct_avg"] = float(np.mean(all_work)) if runs else math.nan
    total_work = sum(r.spec.work * r.spec.gpu_equivalent for r in runs)
    latest = max((r.spec.submit + r.spec.work for r in runs), default=0.0) - first_submit
    out["bound_makespan"] = max(total_work / total_gpus, latest)
    out["jct_vs_bound"] = out["jct_avg"] / out["bound_jct_avg"] if done else math.nan
    out["makespan_vs_bound"] = (
        makespan / out["bound_makespan"] if out["bound_makespan"] > 0 else math.nan
    )
    out["cycles"] = result.cycles
    out["invalid_decisions"] = len(state.invalid_decisions)
    out["wall_seconds"] = result.wall_seconds
    out["policy_seconds"] = result.policy_seconds
    return out


RATIO_KEYS = (
    "jct_avg",
    "jct_p50",
    "jct_p95",
    "jct_p99",
    "queue_avg",
    "makespan",
    "utilization",
    "slowdown_avg",
    "ftf_rho_avg",
)


def ratios(metrics: dict[str, Any], reference: dict[str, Any]) -> dict[str, float | None]:
    """metric / reference metric for the keys that compare across policies."""
    out: dict[str, float | None] = {}
    for key in RATIO_KEYS:
        a, b = metrics.get(key), reference.get(key)
        if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
            out[key] = None
        else:
            out[key] = a / b
    return out
