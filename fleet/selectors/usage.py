"""GPU-hours per team and per user over a period, from jobs' start and finish times.

A job counts from `started_at` to `finished_at` (or `now` while it runs), clipped to the
period, times the GPUs it holds: whole GPUs count as themselves, a fractional job as its
compute share of one GPU. Jobs that never started count nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q

from fleet.models import Job, Team
from fleet.models.jobs import ACTIVE_STATES


@dataclass
class Usage:
    since: datetime
    until: datetime
    by_team: dict[str, float] = field(default_factory=dict)
    by_user: dict[tuple[str, str], float] = field(default_factory=dict)  # (team, user)

    @property
    def hours(self) -> float:
        return (self.until - self.since).total_seconds() / 3600

    @property
    def total(self) -> float:
        return sum(self.by_team.values())


def gpu_share(gpus: int, compute_percent: int | None) -> float:
    if gpus >= 1:
        return float(gpus)
    return (compute_percent or 0) / 100


def gpu_hours(*, since: datetime, until: datetime, now: datetime) -> Usage:
    """GPU-hours used in [since, until) by team slug and by (team slug, user name)."""
    usage = Usage(since=since, until=until)
    end_cap = min(until, now)
    jobs = Job.objects.filter(started_at__isnull=False, started_at__lt=until).filter(
        Q(finished_at__isnull=True) | Q(finished_at__gt=since)
    )
    rows = jobs.values_list(
        "team__slug", "owner__username", "gpus", "gpu_compute_percent", "started_at",
        "finished_at", "state",
    )  # fmt: skip
    for team, user, gpus, percent, started, finished, state in rows:
        if started is None or (finished is None and state not in ACTIVE_STATES):
            continue  # lost or requeued without a finish time: nothing to count on
        start = max(started, since)
        end = min(finished or end_cap, end_cap)
        seconds = (end - start).total_seconds()
        if seconds <= 0:
            continue
        hours = seconds / 3600 * gpu_share(gpus, percent)
        usage.by_team[team] = usage.by_team.get(team, 0.0) + hours
        usage.by_user[(team, user)] = usage.by_user.get((team, user), 0.0) + hours
    return usage


def team_allocation() -> list[dict[str, Any]]:
    """Per team: guaranteed GPUs, hard limit, and GPUs its assigned or running jobs hold now."""
    held: dict[int, float] = {}
    active = Job.objects.filter(state__in=ACTIVE_STATES).values_list(
        "team_id", "gpus", "gpu_compute_percent"
    )
    for team_id, gpus, percent in active:
        held[team_id] = held.get(team_id, 0.0) + gpu_share(gpus, percent)
    return [
        {
            "slug": t.slug,
            "name": t.name,
            "guaranteed": t.guaranteed_gpus,
            "limit": t.gpu_limit,
            "allocated": held.get(t.pk, 0.0),
        }
        for t in Team.objects.order_by("slug")
    ]
