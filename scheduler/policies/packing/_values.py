"""Job value, queue order and settings lookup shared by the packing policies.

A job's value is its weight (base priority, age, team weight) times its size in GPU
equivalents, so the packers maximise priority-weighted GPU use rather than the number of
jobs started (which would starve large gangs behind many small jobs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from scheduler.core.model import PendingJob, Snapshot

HOUR = 3600.0

# Keys read from `snapshot.settings` (admin-edited); constructor params override them.
DEFAULTS: dict[str, Any] = {
    "value_priority_weight": 0.1,  # weight = 1 + w * priority (floored at value_min_weight)
    "value_age_weight": 0.01,  # per hour waited: weight *= 1 + w * age_hours
    "value_size_exponent": 1.0,  # value = weight * gpu_equivalent ** exponent
    "value_min_weight": 0.01,
    "fragmentation_penalty": 0.05,  # per stranded free GPU, in value units (GA/SA fitness)
}


def setting(params: Mapping[str, Any], snapshot: Snapshot, key: str, default: Any = None) -> Any:
    """Constructor param, else the snapshot's setting, else `DEFAULTS`, else `default`."""
    if key in params and params[key] is not None:
        return params[key]
    if key in snapshot.settings and snapshot.settings[key] is not None:
        return snapshot.settings[key]
    return DEFAULTS.get(key, default)


def job_weight(job: PendingJob, snapshot: Snapshot, params: Mapping[str, Any]) -> float:
    pw = float(setting(params, snapshot, "value_priority_weight"))
    aw = float(setting(params, snapshot, "value_age_weight"))
    floor = float(setting(params, snapshot, "value_min_weight"))
    age_hours = max(0.0, snapshot.now - job.submitted_at) / HOUR
    team = snapshot.teams.get(job.team)
    team_weight = team.priority_weight if team is not None else 1.0
    base = max(floor, 1.0 + pw * job.priority)
    return max(floor, base * (1.0 + aw * age_hours) * team_weight)


def job_size(job: PendingJob) -> float:
    # A fraction that declares no compute share still occupies part of a GPU.
    return max(job.gpu_equivalent, 0.01)


def job_values(snapshot: Snapshot, params: Mapping[str, Any]) -> dict[int, float]:
    exponent = float(setting(params, snapshot, "value_size_exponent"))
    return {
        job.id: job_weight(job, snapshot, params) * job_size(job) ** exponent
        for job in snapshot.pending
    }


def greedy_order(jobs: Iterable[PendingJob]) -> list[PendingJob]:
    """Priority first, then size descending (first-fit-decreasing), then oldest, then id."""
    return sorted(jobs, key=lambda j: (-j.priority, -j.gpu_equivalent, j.submitted_at, j.id))


def value_order(jobs: Iterable[PendingJob], values: Mapping[int, float]) -> list[PendingJob]:
    return sorted(jobs, key=lambda j: (-values[j.id], j.submitted_at, j.id))
