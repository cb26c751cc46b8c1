"""The snapshot's running and pending jobs, built from database rows and kept across cycles.

A job whose row and derived inputs (team, owner, prediction, earlier attempts) read the same
as in the last snapshot of this process keeps its `RunningJob` or `PendingJob` object: the
object is a function of exactly those values, so keeping it changes nothing the policy sees,
and the policies' structures carried by object identity (the priority order's score rows,
the release timeline, the quota totals) then carry over in production as they do in the
simulator. A job whose values differ in any of them gets a new object; a job gone is
dropped. Nothing but equal values ever reuses an object, so a crash or a concurrent write
can cost a rebuild, never a wrong snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import F, FloatField, Func

from fleet.models import JobState
from scheduler.core.model import Member, PendingJob, RunningJob
from scheduler.cycle.usage import RunningSince, gpu_equivalent

Predict = Callable[[int, str, int], float | None]


def epoch(name: str) -> Any:
    """The column in seconds since the epoch. PostgreSQL computes it: parsing tens of
    thousands of timestamps in Python would cost more than the rest of the snapshot."""
    if connection.vendor == "postgresql":
        return Func(
            F(name), template="date_part('epoch', %(expressions)s)", output_field=FloatField()
        )
    return F(name)


def seconds(value: datetime | float | None) -> float | None:
    """A value read through `snapshot.epoch()` as float seconds (None stays None)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value)


def seconds_or(value: datetime | float | None, default: float) -> float:
    found = seconds(value)
    return default if found is None else found


@dataclass(frozen=True)
class JobInputs:
    """What building a job object needs besides its row: the snapshot's time, team rows by
    id, user names by id, earlier attempts by job id (`never` for a job without) and the
    runtime prediction."""

    t_now: float
    teams: Mapping[int, tuple[Any, ...]]
    users: Mapping[int, str]
    earlier: Mapping[int, Any]
    never: Any
    predict: Predict

    def of(
        self, job_id: int, team_id: int, owner_id: int, name: str, limit: int
    ) -> tuple[Any, float | None, str, str]:
        """One job's earlier attempts, predicted runtime, team slug and owner's name."""
        return (
            self.earlier.get(job_id, self.never),
            self.predict(owner_id, name, limit),
            self.teams[team_id][1],
            self.users.get(owner_id, ""),
        )


class CarriedJobs:
    """job id -> (the values an object was built from, the object, the row it was built from),
    from the last build.

    A row kept between snapshots (scheduler.cycle.snapshot_rows) is the same tuple object
    while its version is the same, so a job whose row is the very tuple its object was built
    from, in an unchanged context (team rows, predictor, nodes' names) and with the same
    owner name and earlier attempts, keeps its object without comparing all its values."""

    def __init__(self) -> None:
        self.running: dict[int, tuple[tuple[Any, ...], RunningJob, tuple[Any, ...]]] = {}
        self.pending: dict[int, tuple[tuple[Any, ...], PendingJob, tuple[Any, ...]]] = {}
        # What the running and the pending objects were built in: (team rows, predictor,
        # nodes' names) and (team rows, predictor).
        self.running_context: tuple[Any, ...] | None = None
        self.pending_context: tuple[Any, ...] | None = None
        self.reused = 0  # objects kept by the last build (for tests and benches)
        self.by_row = 0  # of those, kept because their row was the same object
        # The last build's whole output and what it was built from: (rows list, context,
        # earlier attempts, owners' names, gang members) -> output. When the rows are the
        # very list read last time (nothing changed, scheduler.cycle.snapshot_rows) and the
        # rest reads the same, every job would keep its object: the lists are kept whole.
        self.running_whole: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None
        self.pending_whole: tuple[tuple[Any, ...], list[PendingJob]] | None = None
        self.whole = False  # whether the last build kept its lists whole


CARRIED = CarriedJobs()


def running_jobs(
    active: Sequence[tuple[Any, ...]],
    inputs: JobInputs,
    *,
    node_names: Mapping[int, str],
    members: Mapping[int, list[tuple[int, int, list[Any]]]],
    carried: CarriedJobs = CARRIED,
) -> tuple[list[RunningJob], list[RunningSince]]:
    """Assigned and running jobs (rows of `snapshot._active_fields()`) whose node exists, and
    the runs so far of running ones, for team usage."""
    t_now = inputs.t_now
    last = carried.running
    context = (inputs.teams, inputs.predict, node_names)
    same = carried.running_context == context
    whole = (active, context, inputs.earlier, inputs.users, members)
    if same and _same_inputs(carried.running_whole, whole):
        assert carried.running_whole is not None
        kept_running, kept_runs = carried.running_whole[1]
        carried.reused = carried.by_row = len(kept_running)
        carried.whole = True
        return list(kept_running), list(kept_runs)
    kept: dict[int, tuple[tuple[Any, ...], RunningJob, tuple[Any, ...]]] = {}
    running: list[RunningJob] = []
    runs: list[RunningSince] = []
    reused = by_row = 0
    timeless = True  # no job's start is "now"
    for row in active:
        (
            job_id, team_id, owner_id, node_id, indices, gpus, mem, comp, started, assigned,
            limit, priority, qos, preemptible, requeues, max_requeues, name, attempt, state,
            per_node, cpus, memory_mb, submitted,
        ) = row  # fmt: skip
        hit = last.get(job_id)
        ranks = members.get(job_id, ())
        if (
            same
            and hit is not None
            and hit[2] is row
            and (started is not None or assigned is not None)  # else it starts "now"
            and hit[0][7] is inputs.earlier.get(job_id)
            and hit[0][8] == inputs.users.get(owner_id, "")
            and hit[0][10] == tuple(ranks)
        ):
            job = hit[1]
            reused += 1
            by_row += 1
            kept[job_id] = hit
            running.append(job)
            if state == JobState.RUNNING and started is not None:
                runs.append((team_id, gpu_equivalent(gpus, comp), job.started_at))
            continue
        if started is None and assigned is None:
            timeless = False
        node = node_names.get(node_id)
        if node is None:
            continue  # its node was deleted: nothing to place around
        start = seconds_or(started, seconds_or(assigned, t_now))
        past, predicted, team, user = inputs.of(job_id, team_id, owner_id, name, limit)
        key = (
            row, node, start, predicted, past.ran, past.queued_at, past.checkpointed,
            inputs.earlier.get(job_id),
            user, tuple(node_names.get(n) for _, n, _ in ranks) if ranks else (), tuple(ranks),
            team,
        )  # fmt: skip
        if hit is not None and hit[0] == key:
            job = hit[1]
            reused += 1
        else:
            job = RunningJob(
                id=job_id,
                team=team,
                user=user,
                node=node,
                gpu_indices=tuple(int(i) for i in indices or ()),
                started_at=start,
                time_limit=float(limit),
                gpus=gpus,
                gpu_memory_mb=mem,
                gpu_compute_percent=comp,
                priority=priority,
                qos=qos,
                preemptible=preemptible,
                predicted_runtime=predicted,
                requeueable=requeues < max_requeues,
                attained_service=past.ran * gpu_equivalent(gpus, comp),
                members=tuple(
                    Member(node_names[n], tuple(int(i) for i in member_indices or ()))
                    for _, n, member_indices in ranks
                    if n in node_names
                ),
                gpus_per_node=per_node,
                cpus=cpus,
                memory_mb=memory_mb,
                preemptions=requeues,
                queued_at=seconds_or(submitted, start)
                if past.queued_at is None
                else past.queued_at,
                checkpointed=past.checkpointed,
            )
        kept[job_id] = (key, job, row)
        running.append(job)
        if state == JobState.RUNNING and started is not None:
            runs.append((team_id, gpu_equivalent(gpus, comp), start))
    carried.running = kept
    carried.running_context = context
    carried.running_whole = (whole, (tuple(running), tuple(runs))) if timeless else None
    carried.reused, carried.by_row, carried.whole = reused, by_row, False
    return running, runs


def _same_inputs(last: tuple[tuple[Any, ...], Any] | None, now: tuple[Any, ...]) -> bool:
    """Whether a whole build's inputs (rows list, context, earlier attempts, owners' names[,
    gang members]) are those of `last`: the rows list the same object, the rest equal."""
    if last is None:
        return False
    before = last[0]
    return before[0] is now[0] and all(a == b for a, b in zip(before[1:], now[1:], strict=True))


# Fields of a pending row (`snapshot._pending_fields()`) that are the job's wait as stored
# (reason, position, ETA): what the cycle writes, not what the policy reads.
WAIT_COLUMNS = slice(15, 18)


def pending_jobs(
    pending: Sequence[tuple[Any, ...]], inputs: JobInputs, *, carried: CarriedJobs = CARRIED
) -> list[PendingJob]:
    """Pending jobs from rows of `snapshot._pending_fields()`, in the rows' order."""
    t_now = inputs.t_now
    last = carried.pending
    context = (inputs.teams, inputs.predict)
    same = carried.pending_context == context
    whole = (pending, context, inputs.earlier, inputs.users)
    if same and _same_inputs(carried.pending_whole, whole):
        assert carried.pending_whole is not None
        kept_queued = carried.pending_whole[1]
        carried.reused += len(kept_queued)
        carried.by_row += len(kept_queued)
        return list(kept_queued)
    kept: dict[int, tuple[tuple[Any, ...], PendingJob, tuple[Any, ...]]] = {}
    queued: list[PendingJob] = []
    reused = by_row = 0
    timeless = True  # no job was submitted "now"
    for row in pending:
        (
            job_id, team_id, owner_id, submitted, limit, gpus, mem, comp, model, min_mem,
            priority, qos, preemptible, name, attempt, _, _, _, requeues,
            per_node, cpus, memory_mb, same_group,
        ) = row  # fmt: skip
        hit = last.get(job_id)
        if (
            same
            and hit is not None
            and hit[2] is row
            and submitted is not None  # else it was submitted "now"
            and hit[0][8] is inputs.earlier.get(job_id)
            and hit[0][7] == inputs.users.get(owner_id, "")
        ):
            reused += 1
            by_row += 1
            kept[job_id] = hit
            queued.append(hit[1])
            continue
        timeless = timeless and submitted is not None
        past, predicted, team, user = inputs.of(job_id, team_id, owner_id, name, limit)
        submitted_at = seconds_or(submitted, t_now)
        key = (
            row[:15], row[18:], submitted_at, predicted, past.ran, past.queued_at, team, user,
            inputs.earlier.get(job_id),
        )  # fmt: skip
        if hit is not None and hit[0] == key:
            job = hit[1]
            reused += 1
        else:
            job = PendingJob(
                id=job_id,
                team=team,
                user=user,
                submitted_at=submitted_at,
                time_limit=float(limit),
                gpus=gpus,
                gpu_memory_mb=mem,
                gpu_compute_percent=comp,
                gpu_model=model or None,
                min_gpu_memory_mb=min_mem,
                priority=priority,
                qos=qos,
                preemptible=preemptible,
                name=name,
                predicted_runtime=predicted,
                attained_service=past.ran * gpu_equivalent(gpus, comp),
                gpus_per_node=per_node,
                cpus=cpus,
                memory_mb=memory_mb,
                same_group=same_group,
                preemptions=requeues,
                queued_at=submitted_at if past.queued_at is None else past.queued_at,
            )
        kept[job_id] = (key, job, row)
        queued.append(job)
    carried.pending = kept
    carried.pending_context = context
    carried.pending_whole = (whole, list(queued)) if timeless else None
    carried.reused += reused
    carried.by_row += by_row
    return queued
