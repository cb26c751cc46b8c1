"""Decayed GPU-seconds per team, for fair share, without reading the whole job history.

Each team's `TeamUsage` row holds its decayed usage as of a moment; a cycle decays it by
the time since (scheduler.core.usage.decay_usage) and adds the GPU-seconds run in between:
by running jobs, and by jobs that finished since. A team seen for the first time starts
from the jobs of the last few half-lives, each decayed from the middle of its run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import chain

from django.db import connection

from fleet.models import Job, Team
from scheduler.core.model import FULL_COMPUTE
from scheduler.core.usage import decay_factor, decay_usage
from scheduler.models import TeamUsage

# How far back a team's first figure looks, in half-lives (older usage counts < 1/16).
BOOTSTRAP_HALF_LIVES = 4
BOOTSTRAP_MAX = timedelta(days=60)


@dataclass(frozen=True, slots=True)
class Run:
    """A stretch of GPU use: team, GPU equivalents, start and end (epoch seconds)."""

    team_id: int
    gpu_equivalent: float
    start: float
    end: float


def gpu_equivalent(gpus: int, compute_percent: int | None) -> float:
    return float(gpus) if gpus else (compute_percent or 0) / FULL_COMPUTE


# A running job's stretch so far: (team id, GPU equivalents, start); it ends at the
# snapshot's time. A tuple, not a `Run`: a cycle passes one per running job, and a worker
# keeps them from one cycle to the next while the running jobs read the same.
RunningSince = tuple[int, float, float]


def _overlap(run: Run, since: float, until: float) -> float:
    return max(0.0, min(run.end, until) - max(run.start, since))


def _finished_since(since: datetime, until: float) -> list[Run]:
    rows = Job.objects.filter(finished_at__gt=since, started_at__isnull=False).values_list(
        "team_id", "gpus", "gpu_compute_percent", "started_at", "finished_at"
    )
    return [
        Run(team, gpu_equivalent(gpus, comp), started.timestamp(), min(ended.timestamp(), until))
        for team, gpus, comp, started, ended in rows
        if started is not None and ended is not None
    ]


def team_usage(
    *, now: datetime, half_life: float, running: Sequence[RunningSince], save: bool
) -> dict[int, float]:
    """team id -> decayed GPU-seconds at `now`; with `save`, the rows are brought up to date."""
    t_now = now.timestamp()
    stored = {u.team_id: u for u in TeamUsage.objects.all()}
    team_ids = list(Team.objects.values_list("id", flat=True))
    window = min(timedelta(seconds=BOOTSTRAP_HALF_LIVES * half_life), BOOTSTRAP_MAX)
    fresh = [t for t in team_ids if t not in stored]
    oldest = min(
        [u.as_of for u in stored.values()] + ([now - window] if fresh else []), default=now
    )
    finished = _finished_since(oldest, t_now) if oldest < now else []

    by_team: dict[int, list[Run]] = {}
    # Per team with a stored row, its running jobs' (GPU equivalents, start), in order.
    running_by_team: dict[int, list[tuple[float, float]]] = {}
    for team_id, amount, start in running:
        if team_id in stored:
            running_by_team.setdefault(team_id, []).append((amount, start))
        else:
            by_team.setdefault(team_id, []).append(Run(team_id, amount, start, t_now))
    for r in finished:
        by_team.setdefault(r.team_id, []).append(r)
    out: dict[int, float] = {}
    for team_id in team_ids:
        row = stored.get(team_id)
        runs = by_team.get(team_id, [])
        if row is None:
            since = (now - window).timestamp()
            value = 0.0
            for r in runs:
                span = _overlap(r, since, t_now)
                if span > 0:
                    middle = max(r.start, since) + span / 2
                    value += r.gpu_equivalent * span * decay_factor(t_now - middle, half_life)
        else:
            since = row.as_of.timestamp()
            # As `_overlap` of a run that ends now, summed in the same order (running first).
            used = sum(
                chain(
                    (
                        amount * max(0.0, t_now - max(start, since))
                        for amount, start in running_by_team.get(team_id, ())
                    ),
                    (r.gpu_equivalent * _overlap(r, since, t_now) for r in runs),
                )
            )
            value = decay_usage(row.decayed_gpu_seconds, used, t_now - since, half_life)
        out[team_id] = value
    if save:
        _save(out, stored, now)
    return out


def _save(values: dict[int, float], stored: dict[int, TeamUsage], now: datetime) -> None:
    changed, created = [], []
    for team_id, value in values.items():
        row = stored.get(team_id)
        if row is None:
            created.append(TeamUsage(team_id=team_id, decayed_gpu_seconds=value, as_of=now))
        elif row.as_of < now:
            row.decayed_gpu_seconds, row.as_of = value, now
            changed.append(row)
    if changed and connection.vendor == "postgresql":
        # One statement over the values: bulk_update's CASE per row cost more to build
        # than the rest of the usage.
        table = TeamUsage._meta.db_table
        rows = ", ".join(["(%s, %s::double precision, %s::timestamptz)"] * len(changed))
        with connection.cursor() as cursor:
            cursor.execute(
                f'UPDATE "{table}" AS u SET decayed_gpu_seconds = v.value, as_of = v.as_of '
                f"FROM (VALUES {rows}) AS v(id, value, as_of) WHERE u.id = v.id",
                [x for r in changed for x in (r.pk, r.decayed_gpu_seconds, r.as_of)],
            )
    elif changed:
        TeamUsage.objects.bulk_update(changed, ["decayed_gpu_seconds", "as_of"])
    if created:
        TeamUsage.objects.bulk_create(created, ignore_conflicts=True)
