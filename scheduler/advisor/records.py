"""Recorded jobs as plain values, the fleet trace rows they export to, and the metrics of
what actually happened (pure: no Django).

A job's runtime in the trace is the length of its last attempt: earlier attempts were
preempted, requeued or lost and their progress discarded (the simulator's model without
checkpointing), so the last one is the work the job needs when nothing stops it. A job still
running when the trace is taken counts as if it finished then (its runtime is a lower bound).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from scheduler.core.model import nodes_spanned
from scheduler.sim.metrics import SLOWDOWN_FLOOR_S, jain
from scheduler.sim.sources import FLEET_COLUMNS


@dataclass(frozen=True, slots=True)
class RecordedJob:
    """One job as the database recorded it; times are epoch seconds."""

    id: int
    name: str
    submit: float
    team: str
    user: str
    gpus: int
    time_limit: float
    state: str
    # Every stretch the job held its GPUs in state running: (start, end), oldest first.
    runs: tuple[tuple[float, float], ...]
    gpus_per_node: int = 0
    gpu_memory_mb: int | None = None
    gpu_compute_percent: int | None = None
    gpu_model: str = ""
    cpus: int = 0
    memory_mb: int = 0
    priority: int = 0
    qos: str = "normal"
    preemptible: bool = False
    # Times a running attempt went back to the queue (preempted or requeued).
    preemptions: int = 0

    @property
    def first_start(self) -> float:
        return self.runs[0][0]

    @property
    def finish(self) -> float:
        return self.runs[-1][1]

    @property
    def runtime(self) -> float:
        start, end = self.runs[-1]
        return max(0.0, end - start)

    @property
    def nodes(self) -> int:
        """How many nodes the job spans (1 unless it is a multi-node gang)."""
        return nodes_spanned(self.gpus, self.gpus_per_node)

    @property
    def gpu_equivalent(self) -> float:
        if self.gpus:
            return float(self.gpus)
        return (self.gpu_compute_percent or 100) / 100.0


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def _blank(value: Any) -> str:
    return "" if value is None else str(value)


def trace_rows(jobs: Iterable[RecordedJob]) -> list[dict[str, str]]:
    """The fleet trace, one row per job by submit time, keys in FLEET_COLUMNS order."""
    rows = []
    for j in sorted(jobs, key=lambda j: (j.submit, j.id)):
        rows.append(
            {
                "id": str(j.id),
                "name": j.name,
                "submit": _iso(j.submit),
                "runtime": f"{j.runtime:.3f}",
                "gpus": str(j.gpus),
                "gpus_per_node": str(j.gpus_per_node),
                "nodes": str(j.nodes),
                "gpu_model": j.gpu_model,
                "gpu_memory_mb": _blank(j.gpu_memory_mb),
                "gpu_compute_percent": _blank(j.gpu_compute_percent),
                "cpus": str(j.cpus),
                "memory_mb": str(j.memory_mb),
                "team": j.team,
                "user": j.user,
                "priority": str(j.priority),
                "qos": j.qos,
                "preemptible": "true" if j.preemptible else "false",
                "time_limit": f"{j.time_limit:g}",
                "state": j.state,
                "started": _iso(j.first_start),
                "finished": _iso(j.finish),
            }
        )
        rows[-1] = {k: rows[-1][k] for k in FLEET_COLUMNS}
    return rows


@dataclass(slots=True)
class Comparison:
    """The metrics the advisor shows, for what happened and for each candidate."""

    jobs: int = 0
    wait_avg: float = math.nan
    wait_p95: float = math.nan
    jct_avg: float = math.nan
    utilization: float = math.nan
    # Jain's index over teams of each team's average bounded slowdown (1.0: even).
    fairness_jain: float = math.nan
    team_slowdown: dict[str, float] = field(default_factory=dict)
    preemptions_per_job: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        def clean(v: float) -> float | None:
            return None if isinstance(v, float) and not math.isfinite(v) else v

        return {
            "jobs": self.jobs,
            "wait_avg": clean(self.wait_avg),
            "wait_p95": clean(self.wait_p95),
            "jct_avg": clean(self.jct_avg),
            "utilization": clean(self.utilization),
            "fairness_jain": clean(self.fairness_jain),
            "team_slowdown": {k: clean(v) for k, v in sorted(self.team_slowdown.items())},
            "preemptions_per_job": clean(self.preemptions_per_job),
        }


def actual_metrics(jobs: list[RecordedJob], total_gpus: int) -> Comparison:
    """What happened, measured as the simulator measures a run: wait = first start - submit,
    JCT = finish - submit, utilization = GPU-seconds held in state running / (GPUs x (last
    finish - first submit)), bounded slowdown max(1, JCT / max(runtime, 10 s))."""
    out = Comparison(jobs=len(jobs))
    if not jobs:
        return out
    wait = np.array([j.first_start - j.submit for j in jobs], dtype=float)
    jct = np.array([j.finish - j.submit for j in jobs], dtype=float)
    out.wait_avg = float(wait.mean())
    out.wait_p95 = float(np.percentile(wait, 95))
    out.jct_avg = float(jct.mean())
    span = max(j.finish for j in jobs) - min(j.submit for j in jobs)
    held = sum((end - start) * j.gpu_equivalent for j in jobs for start, end in j.runs)
    out.utilization = held / (total_gpus * span) if span > 0 and total_gpus else math.nan
    per_team: dict[str, list[float]] = {}
    for j, t in zip(jobs, jct, strict=True):
        slowdown = max(1.0, float(t) / max(j.runtime, SLOWDOWN_FLOOR_S))
        per_team.setdefault(j.team, []).append(slowdown)
    out.team_slowdown = {t: sum(v) / len(v) for t, v in per_team.items()}
    out.fairness_jain = jain(list(out.team_slowdown.values()))
    out.preemptions_per_job = sum(j.preemptions for j in jobs) / len(jobs)
    return out


def from_sim(metrics: dict[str, Any]) -> Comparison:
    """The same metrics from a simulator run (scheduler.sim.metrics.compute_metrics)."""
    return Comparison(
        jobs=int(metrics.get("jobs") or 0),
        wait_avg=float(metrics.get("queue_avg", math.nan)),
        wait_p95=float(metrics.get("queue_p95", math.nan)),
        jct_avg=float(metrics.get("jct_avg", math.nan)),
        utilization=float(metrics.get("utilization", math.nan)),
        fairness_jain=float(metrics.get("jain_slowdown", math.nan)),
        team_slowdown=dict(metrics.get("team_slowdown") or {}),
        preemptions_per_job=float(metrics.get("preemptions_per_job") or 0.0),
    )
