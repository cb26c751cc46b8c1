"""Reads for the advisor: the recorded jobs of the last days, the fleet's nodes as a simulator
cluster, and the fleet trace as CSV text.

Which jobs: those submitted in the window that held GPUs at least once. A finished job
(succeeded, failed, timed out, cancelled after it started) counts with its last attempt's
runtime; a job running now counts as if it finished now. Jobs that never started (pending,
held, assigned and not yet started, cancelled or failed while waiting, lost or requeued and
waiting again) are left out: nothing says how long they would run. They are counted in
`Export.left_out`.
"""

from __future__ import annotations

import csv
import io
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Prefetch, QuerySet

from fleet.errors import ApplicationError
from fleet.models import Job, JobEvent, JobState, Node, Team
from fleet.models.nodes import NodeState
from scheduler.advisor.records import RecordedJob, trace_rows
from scheduler.sim.cluster import ClusterSpec, NodeSpec
from scheduler.sim.sources import FLEET_COLUMNS

MAX_DAYS = 90
MAX_JOBS = 5000
_MODEL = re.compile(r"[^A-Za-z0-9_.-]+")


def model_token(model: str) -> str:
    """A GPU model name as a cluster spec can spell it (`NVIDIA A100-SXM4-80GB` ->
    `NVIDIA-A100-SXM4-80GB`); jobs' gpu_model is spelled the same way in the trace."""
    return _MODEL.sub("-", model).strip("-") or "GPU"


def check_days(days: object) -> int:
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        message = f"days must be a whole number from 1 to {MAX_DAYS}."
        raise ApplicationError(message, {"fields": {"days": [message]}})
    return days


def window_jobs(*, days: int, now: datetime) -> QuerySet[Job]:
    return Job.objects.filter(submitted_at__gte=now - timedelta(days=days))


def check_job_count(*, days: int, now: datetime) -> int:
    count = window_jobs(days=days, now=now).count()
    if count > MAX_JOBS:
        raise ApplicationError(
            f"The last {days} days hold {count:,} jobs; the advisor replays at most "
            f"{MAX_JOBS:,}. Ask for fewer days.",
            {"fields": {"days": [f"At most {MAX_JOBS:,} jobs; choose fewer days."]}},
        )
    return count


_RUNNING = JobState.RUNNING.value
_FINISHED = (JobState.SUCCEEDED, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED)


def _record(job: Job, now: float) -> RecordedJob | None:
    runs: list[tuple[float, float]] = []
    started: float | None = None
    preemptions = 0
    for ev in job.events.all():  # applied events, oldest first (prefetched)
        at = ev.at.timestamp()
        if ev.to_state == _RUNNING and started is None:
            started = at
        elif ev.from_state == _RUNNING and started is not None:
            runs.append((started, at))
            started = None
            if ev.to_state == JobState.PENDING:
                preemptions += 1
    if started is not None:
        if job.state != _RUNNING:  # a running stretch the events do not close
            end = job.finished_at.timestamp() if job.finished_at else now
            runs.append((started, min(end, now)))
        else:
            runs.append((started, now))
    if not runs or job.state not in (_RUNNING, *[s.value for s in _FINISHED]):
        return None
    return RecordedJob(
        id=job.pk,
        name=job.name,
        submit=job.submitted_at.timestamp(),
        team=job.team.slug,
        user=job.owner.get_username(),
        gpus=job.gpus,
        time_limit=float(job.time_limit),
        state=job.state,
        runs=tuple(runs),
        gpus_per_node=job.gpus_per_node,
        gpu_memory_mb=job.gpu_memory_mb,
        gpu_compute_percent=job.gpu_compute_percent,
        gpu_model=model_token(job.gpu_model) if job.gpu_model else "",
        cpus=job.cpus,
        memory_mb=job.memory_mb,
        priority=job.priority,
        qos=job.qos,
        preemptible=job.preemptible,
        preemptions=preemptions,
    )


@dataclass
class Export:
    jobs: list[RecordedJob]
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def notes(self) -> list[str]:
        return [
            f"{n} {state} job{'s' if n != 1 else ''} left out: never started"
            for state, n in sorted(self.left_out.items())
        ]


def recorded_jobs(*, days: int, now: datetime) -> Export:
    """The window's jobs that held GPUs, as RecordedJob (see the module docstring)."""
    check_job_count(days=days, now=now)
    events = (
        JobEvent.objects.filter(applied=True)
        .order_by("id")
        .only("job_id", "at", "from_state", "to_state")
    )
    jobs = (
        window_jobs(days=days, now=now)
        .select_related("team", "owner")
        .prefetch_related(Prefetch("events", queryset=events))
        .order_by("submitted_at", "id")
    )
    stamp = now.timestamp()
    out = Export(jobs=[])
    for job in jobs:
        rec = _record(job, stamp)
        if rec is None:
            out.left_out[job.state] = out.left_out.get(job.state, 0) + 1
        elif rec.runtime > 0:
            out.jobs.append(rec)
    return out


@dataclass(frozen=True)
class FleetCluster:
    spec: ClusterSpec
    guarantees: dict[str, int]


def fleet_cluster() -> FleetCluster:
    """The nodes that are up or draining, with their GPUs, host CPUs, memory and groups, as
    a simulator cluster; `spec.text` is the same as a `--cluster` spec (without groups and
    with GPU memory from the simulator's table)."""
    nodes = (
        Node.objects.filter(state__in=[NodeState.UP, NodeState.DRAINING])
        .prefetch_related("gpus")
        .order_by("name")
    )
    specs: list[NodeSpec] = []
    for node in nodes:
        gpus = list(node.gpus.all())
        if not gpus:
            continue
        model = Counter(g.model for g in gpus).most_common(1)[0][0]
        specs.append(
            NodeSpec(
                name=node.name,
                gpus=len(gpus),
                model=model_token(model),
                memory_mb=min(g.memory_mb for g in gpus if g.model == model),
                cpus=node.cpus or None,
                host_memory_mb=node.memory_mb or None,
                group=node.group,
            )
        )
    if not specs:
        raise ApplicationError(
            "The fleet has no node that is up or draining with GPUs, so there is nothing to "
            "simulate on. Register a node (or resume a drained one) first."
        )
    guarantees = {
        t.slug: t.guaranteed_gpus for t in Team.objects.filter(guaranteed_gpus__gt=0).only("slug")
    }
    return FleetCluster(ClusterSpec(tuple(specs), _spec_text(specs)), guarantees)


def _spec_text(nodes: list[NodeSpec]) -> str:
    parts: list[tuple[str, int]] = []
    for n in nodes:
        opts = []
        if n.cpus:
            opts.append(f"cpus={n.cpus}")
        if n.host_memory_mb:
            opts.append(f"mem={max(1, n.host_memory_mb // 1024)}")
        shape = f"{n.gpus}x{n.model}" + (f"[{','.join(opts)}]" if opts else "")
        if parts and parts[-1][0] == shape:
            parts[-1] = (shape, parts[-1][1] + 1)
        else:
            parts.append((shape, 1))
    return "+".join(f"{count}x{shape}" for shape, count in parts)


def trace_csv(export: Export) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FLEET_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(trace_rows(export.jobs))
    return buf.getvalue()
