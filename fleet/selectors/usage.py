"""GPU time per attempt, per team and per user over a period, from the job event history.

Every attempt counts: an attempt runs from its transition to running until its transition
out of running (success, failure, timeout, cancel, requeue, preemption, loss), or until
`now` while it still runs. A requeue or preemption therefore ends one attempt and a later
dispatch starts another; both are counted. Whole GPUs count as themselves, a fractional job
as its compute share of one GPU. Host CPUs and memory count too: an attempt holds its
`cpus` and `memory_mb` on each of its nodes (one, or gpus // gpus_per_node for a multi-node
gang), so it uses cpus x nodes CPU-hours and memory_mb x nodes / 1024 GB-hours an hour. Each interval is clipped to the period and attributed to
the job's owner and team.

Jobs with no event history of running (rows written before events existed, or imported)
fall back to their `started_at`/`finished_at` columns, which hold the last attempt only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q

from fleet.models import Job, JobEvent, JobState, Team
from fleet.models.jobs import ACTIVE_STATES

RUNNING = JobState.RUNNING


@dataclass(frozen=True)
class Attempt:
    """One attempt's time on its GPUs inside the period (start and end already clipped)."""

    job_id: int
    job_name: str
    team: str
    user: str
    attempt: int
    state: str  # what the attempt became when it left running; "running" while it runs
    start: datetime
    end: datetime
    gpus: float
    cpus: int = 0  # over all of the attempt's nodes
    memory_mb: int = 0  # over all of the attempt's nodes

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())

    @property
    def gpu_seconds(self) -> float:
        return self.seconds * self.gpus

    @property
    def cpu_seconds(self) -> float:
        return self.seconds * self.cpus

    @property
    def mem_gb_seconds(self) -> float:
        return self.seconds * self.memory_mb / 1024


@dataclass
class Usage:
    since: datetime
    until: datetime
    attempts: list[Attempt] = field(default_factory=list)
    by_team: dict[str, float] = field(default_factory=dict)  # GPU-hours
    by_user: dict[tuple[str, str], float] = field(default_factory=dict)  # (team, user)

    @property
    def hours(self) -> float:
        return (self.until - self.since).total_seconds() / 3600

    @property
    def total(self) -> float:
        return sum(self.by_team.values())


def node_count(gpus: int, gpus_per_node: int) -> int:
    """Nodes a job spans, as `Job.nodes` counts them."""
    return gpus // gpus_per_node if gpus_per_node and gpus > gpus_per_node else 1


def gpu_share(gpus: int, compute_percent: int | None) -> float:
    if gpus >= 1:
        return float(gpus)
    return (compute_percent or 0) / 100


@dataclass
class _JobInfo:
    name: str
    team: str
    user: str
    share: float
    state: str
    cpus: int
    memory_mb: int


def _job_info(job_ids: Iterable[int]) -> dict[int, _JobInfo]:
    rows = Job.objects.filter(id__in=list(job_ids)).values_list(
        "id", "name", "team__slug", "owner__username", "gpus", "gpu_compute_percent", "state",
        "gpus_per_node", "cpus", "memory_mb",
    )  # fmt: skip
    out = {}
    for pk, name, team, user, gpus, percent, state, per_node, cpus, memory_mb in rows:
        nodes = node_count(gpus, per_node)
        share = gpu_share(gpus, percent)
        out[pk] = _JobInfo(name, team, user, share, state, cpus * nodes, memory_mb * nodes)
    return out


def _event_attempts(
    *, since: datetime, until: datetime, end_cap: datetime, team_ids: set[int] | None
) -> list[Attempt]:
    # Intervals that may overlap the period belong to jobs that left running after `since`
    # or run now; their running events before `until` give the intervals. The jobs are
    # read first and their events then by job (the (job, id) index), in slices: a join
    # or IN (subquery) here is at the mercy of the planner's row estimates.
    left_after = (
        JobEvent.objects.filter(applied=True, from_state=RUNNING, at__gt=since)
        .exclude(to_state=RUNNING)
        .values_list("job_id", flat=True)
        .distinct()
    )
    job_ids = set(left_after) | set(Job.objects.filter(state=RUNNING).values_list("id", flat=True))
    if team_ids is not None:
        job_ids &= set(Job.objects.filter(team_id__in=team_ids).values_list("id", flat=True))
    columns = ("id", "job_id", "from_state", "to_state", "attempt", "at")
    ordered = sorted(job_ids)
    found: dict[int, tuple[Any, ...]] = {}
    for i in range(0, len(ordered), 2000):
        query = JobEvent.objects.filter(
            job_id__in=ordered[i : i + 2000], applied=True, at__lt=until
        ).filter(Q(to_state=RUNNING) | Q(from_state=RUNNING))
        found.update((row[0], row) for row in query.values_list(*columns))
    events = sorted(found.values(), key=lambda row: (row[1], row[0]))
    # job -> (attempt, start) of its open interval
    intervals: list[tuple[int, int, str, datetime, datetime]] = []
    open_: dict[int, tuple[int, datetime]] = {}
    for _, job_id, from_state, to_state, attempt, at in events:
        if to_state == RUNNING and from_state != RUNNING:
            open_[job_id] = (attempt, at)
        elif from_state == RUNNING and to_state != RUNNING and job_id in open_:
            run_attempt, started = open_.pop(job_id)
            intervals.append((job_id, run_attempt, to_state, started, at))
    for job_id, (run_attempt, started) in open_.items():
        # Still running at `until` (or now): count up to the end of what has happened.
        intervals.append((job_id, run_attempt, RUNNING, started, end_cap))
    info = _job_info({i[0] for i in intervals})
    out = []
    for job_id, run_attempt, outcome, started, ended in intervals:
        start, end = max(started, since), min(ended, end_cap)
        if end <= start:
            continue
        job = info[job_id]
        out.append(
            Attempt(
                job_id,
                job.name,
                job.team,
                job.user,
                run_attempt,
                outcome,
                start,
                end,
                job.share,
                job.cpus,
                job.memory_mb,
            )  # fmt: skip
        )
    return out


def _column_attempts(
    *, since: datetime, until: datetime, end_cap: datetime, team_ids: set[int] | None
) -> list[Attempt]:
    """Jobs without any running event: their last attempt from the job's own columns."""
    has_run_event = JobEvent.objects.filter(job=OuterRef("pk"), to_state=RUNNING, applied=True)
    jobs = (
        Job.objects.filter(started_at__isnull=False, started_at__lt=until)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gt=since))
        .filter(~Exists(has_run_event))
    )
    if team_ids is not None:
        jobs = jobs.filter(team_id__in=team_ids)
    rows = jobs.values_list(
        "id", "name", "team__slug", "owner__username", "gpus", "gpu_compute_percent",
        "started_at", "finished_at", "state", "attempt", "gpus_per_node", "cpus", "memory_mb",
    )  # fmt: skip
    out = []
    for row in rows:
        pk, name, team, user, gpus, percent, started, finished, state, attempt = row[:10]
        nodes = node_count(gpus, row[10])
        cpus, memory_mb = row[11] * nodes, row[12] * nodes
        if started is None:
            continue
        if finished is None and state not in ACTIVE_STATES:
            continue  # lost or requeued without a finish time: nothing to count on
        start = max(started, since)
        end = min(finished or end_cap, end_cap)
        if end <= start:
            continue
        share = gpu_share(gpus, percent)
        out.append(
            Attempt(pk, name, team, user, attempt, state, start, end, share, cpus, memory_mb)
        )
    return out


def gpu_hours(
    *, since: datetime, until: datetime, now: datetime, team_ids: set[int] | None = None
) -> Usage:
    """GPU time used in [since, until): every attempt, and GPU-hours by team slug and by
    (team slug, user name). `team_ids` limits it to those teams (None: every team)."""
    usage = Usage(since=since, until=until)
    end_cap = min(until, now)
    if end_cap <= since:
        return usage
    kwargs: dict[str, Any] = {
        "since": since,
        "until": until,
        "end_cap": end_cap,
        "team_ids": team_ids,
    }
    attempts = _event_attempts(**kwargs) + _column_attempts(**kwargs)
    attempts.sort(key=lambda a: (a.start, a.job_id, a.attempt))
    usage.attempts = attempts
    for a in attempts:
        hours = a.gpu_seconds / 3600
        usage.by_team[a.team] = usage.by_team.get(a.team, 0.0) + hours
        usage.by_user[(a.team, a.user)] = usage.by_user.get((a.team, a.user), 0.0) + hours
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
