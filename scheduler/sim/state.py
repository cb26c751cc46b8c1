"""The simulated cluster: GPUs, pending and running jobs, the event heap, the snapshot.

Everything that changes during a run goes through `SimState.start`, `SimState.preempt` and
`SimState.advance`, so that the accounting (GPU-seconds used, lost progress, per-team usage)
has one place to be right. Drivers (production policies, the srpt-oracle, the RL env) decide;
the state applies.

Preemption: a preempted job goes back to pending (or ends when the decision says no requeue
or it has no requeues left). Without checkpointing it loses all progress of the attempt;
with `checkpointing=True` it keeps the work done. Either way its next attempt first spends
`restart_overhead` seconds (on its GPUs) before doing useful work again; those seconds and any
discarded progress are counted as lost GPU-seconds.

Multi-node gangs: a placement books every member's GPUs, host CPUs and memory at once and
releases them all when the job ends or is preempted. A gang spread over more nodes than the
cluster's largest eligible nodes would need, or over more than one topology group, runs
slower: its work takes `1 + gang_spread_slowdown x (extra nodes + extra groups)` times as
long (0 disables); the extra GPU-seconds are counted apart (`spread_gpu_seconds`).
While the oldest waiting job is a multi-node gang, the GPUs left idle are counted as
`gang_wait_gpu_seconds` (GPU-time lost to waiting for gangs).

GPU models: a job with `JobSpec.speeds` runs each attempt at its speed on the GPUs it got
(the slowest member's, for a gang over several models): its remaining work takes
`remaining / speed` seconds, and a preempted attempt keeps `seconds run x speed` of work, so
progress carries over right when the next attempt runs on another model. Its time limit
stretches the same way (as with the spread slowdown): the limit a user asks is taken as
meant for the work, not for the GPU. Policies see the speeds a job declares
(`PendingJob.gpu_speeds`, unless `SimConfig.declare_speeds` is off) and a table learned
from finished jobs' runtimes per job class and model (`Snapshot.gpu_speeds`), as production
learns it.
"""

from __future__ import annotations

import heapq
import math
from types import MappingProxyType
from typing import Any

from scheduler.core.model import (
    Member,
    NodeState,
    PendingJob,
    RunningJob,
    Snapshot,
)
from scheduler.core.usage import DEFAULT_HALF_LIFE
from scheduler.policies.gavel import SpeedLearner, speed_key
from scheduler.sim.admission import ArrivalAdmission
from scheduler.sim.cluster import ClusterSpec
from scheduler.sim.config import SimConfig
from scheduler.sim.free_gpus import FreeGpus
from scheduler.sim.job_run import JobRun, pending_job, running_job
from scheduler.sim.jobs import JobSpec
from scheduler.sim.queue_log import QueueLog, RunLog
from scheduler.sim.service import ServiceHistory
from scheduler.sim.usage import TeamUsage


class SimState:
    def __init__(self, jobs: list[JobSpec], cluster: ClusterSpec, config: SimConfig):
        self.config = config
        self.cluster = cluster
        self.now = 0.0
        self.jobs: dict[int, JobRun] = {j.id: JobRun(j) for j in jobs}
        self._arrivals = sorted(jobs, key=lambda j: (j.submit, j.id))
        self._next_arrival = 0
        self._ends: list[tuple[float, int, int]] = []  # (time, job id, attempt)
        self.pending: dict[int, PendingJob] = {}
        self._queue_log = QueueLog()  # what the next snapshot's pending_changes say
        self._sizes: dict[int, int] = {}  # pending count per GPU request (0: fractional)
        self.running: dict[int, RunningJob] = {}
        self._run_log = RunLog()  # what the next snapshot's running_changes say
        self.gpus = FreeGpus(cluster)
        self.free_whole = self.gpus.free_whole  # per node, its wholly free GPUs (read-only)
        self._nodes = self.gpus.nodes  # GPU models and memory per node (read-only here)
        self.gang_wait_gpu_seconds = 0.0
        self._has_gangs = any(j.nodes > 1 for j in jobs)
        self._oldest: list[tuple[float, int]] = []  # (submit, id) of pending jobs, lazily
        self._admission = ArrivalAdmission(cluster, tuple(self._nodes.values()))
        self.rejected: list[str] = []
        self.total_gpus = cluster.total_gpus
        self.busy_gpus = 0.0
        teams = sorted({j.team for j in jobs})
        self._settings = MappingProxyType(
            {
                "explain": config.explain,
                "plan_waits": config.plan_waits,
                # Policies price preemptions by what the simulator does with them, unless
                # the run's settings say otherwise.
                "preemption_checkpoints": config.checkpointing,
                "preemption_restart_overhead": config.restart_overhead,
                **config.settings,
            }
        )
        half_life = float(self._settings.get("fairshare_half_life", DEFAULT_HALF_LIFE))
        self.usage = TeamUsage(teams, half_life, config.team_guaranteed)
        self.timeline: list[tuple[float, float, int, int]] = []
        self.invalid_decisions: list[str] = []
        self.predictor: Any = None  # optional: .predict(spec) -> float | None, .observe(spec, s)
        self.preemptions = 0
        self.finished = 0
        self.events = 0  # batches of events processed; drivers may skip cycles without news
        self.service = ServiceHistory()  # sizes of finished jobs, for gittins
        self.speeds = SpeedLearner()  # runtimes per job class and GPU model, for gavel
        # A class needs two models to be in the speed table: on a fleet of one model it
        # stays empty, so nothing is learned (each change would rebuild it next snapshot).
        self._learns_speeds = len({g.model for n in self._nodes.values() for g in n.gpus}) > 1

    # -- clock and events ------------------------------------------------------------------

    def next_event_time(self) -> float:
        t = math.inf
        if self._next_arrival < len(self._arrivals):
            t = self._arrivals[self._next_arrival].submit
        while self._ends and self._is_stale(self._ends[0]):
            heapq.heappop(self._ends)
        if self._ends:
            t = min(t, self._ends[0][0])
        return t

    def _is_stale(self, entry: tuple[float, int, int]) -> bool:
        run = self.jobs[entry[1]]
        return run.state != "running" or run.attempt != entry[2]

    @property
    def arrivals_left(self) -> int:
        return len(self._arrivals) - self._next_arrival

    def advance(self, t: float) -> bool:
        """Move the clock to `t`, ending jobs and admitting arrivals due by then.
        Returns whether anything happened."""
        if self._has_gangs and t > self.now and self.pending and self.idle_gpus:
            head = self._oldest_pending()
            if head is not None and self.jobs[head].spec.nodes > 1:
                self.gang_wait_gpu_seconds += self.idle_gpus * (t - self.now)
        self.now = max(self.now, t)
        happened = False
        while self._ends and self._ends[0][0] <= t:
            end, job_id, attempt = heapq.heappop(self._ends)
            run = self.jobs[job_id]
            if run.state == "running" and run.attempt == attempt:
                self._finish(run, end)
                happened = True
        while self._next_arrival < len(self._arrivals):
            spec = self._arrivals[self._next_arrival]
            if spec.submit > t:
                break
            self._next_arrival += 1
            run = self.jobs[spec.id]
            if self._refused(run):
                continue
            if self.predictor is not None:
                run.predicted = self.predictor.predict(spec)
            run.state = "pending"
            self._queue(run)
            happened = True
        if happened:
            self.events += 1
            self._record()
        return happened

    def _oldest_pending(self) -> int | None:
        heap = self._oldest
        while heap and heap[0][1] not in self.pending:
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def _refused(self, run: JobRun) -> bool:
        """Admission control (`ArrivalAdmission`): a job that can never fit on this cluster
        is refused (state "rejected") instead of queued."""
        why = self._admission.refusal(run.spec, lambda: self._pending_job(run))
        if why is None:
            return False
        run.state = "rejected"
        self.rejected.append(f"job {run.spec.id}: {why}")
        return True

    def _queue(self, run: JobRun) -> None:
        g = run.spec.gpus_on_each_node
        self._sizes[g] = self._sizes.get(g, 0) + 1
        job = self.pending[run.spec.id] = self._pending_job(run)
        self._queue_log.joined(job)
        if self._has_gangs:
            heapq.heappush(self._oldest, (run.spec.submit, run.spec.id))

    def _unqueue(self, job_id: int) -> None:
        g = self.jobs[job_id].spec.gpus_on_each_node
        self._queue_log.left(self.pending.pop(job_id))
        left = self._sizes[g] - 1
        if left:
            self._sizes[g] = left
        else:
            del self._sizes[g]

    def could_place(self) -> bool:
        """Whether some pending job might fit now (a cheap necessary condition)."""
        if not self._sizes:
            return False
        if 0 in self._sizes:
            return True
        return min(self._sizes) <= max(self.free_whole.values(), default=0)

    def _record(self) -> None:
        if self.config.record_timeline:
            self.timeline.append((self.now, self.busy_gpus, len(self.pending), len(self.running)))

    # -- decisions --------------------------------------------------------------------------

    @property
    def idle_gpus(self) -> int:
        """Wholly free GPUs."""
        return self.gpus.idle

    def can_fit(self, spec: JobSpec, node: str, gpu_indices: tuple[int, ...]) -> str | None:
        """None when one member of the job fits there now; otherwise why not."""
        return self.gpus.can_fit(spec, node, gpu_indices)

    def host_room(self, spec: JobSpec, node: str) -> bool:
        """Whether the node's free host CPUs and memory hold one member of the job."""
        return self.gpus.host_room(spec, node)

    def whole_free_indices(self, node: str) -> list[int]:
        return self.gpus.whole_free_indices(node)

    def node_states(self) -> tuple[NodeState, ...]:
        """Every node as a snapshot shows it now."""
        return self.gpus.node_states()

    def start(
        self,
        job_id: int,
        node: str,
        gpu_indices: tuple[int, ...],
        members: tuple[Member, ...] = (),
    ) -> str | None:
        """Start a pending job on rank 0 (`node`, `gpu_indices`) and, for a multi-node gang,
        the further `members`; returns None, or why the decision was skipped (then nothing
        is booked)."""
        run = self.jobs.get(job_id)
        if run is None or run.state != "pending":
            return f"job {job_id} is not pending"
        spec = run.spec
        allocs = (Member(node, tuple(gpu_indices)), *members)
        if len(allocs) != spec.nodes:
            return f"job {job_id} runs on {spec.nodes} node(s), got {len(allocs)}"
        if len(allocs) > 1 and len({m.node for m in allocs}) != len(allocs):
            return f"job {job_id}: a gang takes one member per node, got {[m.node for m in allocs]}"
        for m in allocs:
            why = self.gpus.can_fit(spec, m.node, m.gpu_indices)
            if why:
                return why
        for m in allocs:
            self.gpus.take(spec, m.node, m.gpu_indices, -1)
        self._unqueue(job_id)
        run.state = "running"
        run.attempt += 1
        run.started_at = self.now
        run.node, run.gpu_indices = node, allocs[0].gpu_indices
        run.members = allocs
        rate = self.config.gang_spread_slowdown
        run.slowdown = self.gpus.spread_slowdown(spec, allocs, rate) if len(allocs) > 1 else 1.0
        run.speed = self.gpus.speed_on(spec, allocs) if spec.speeds else 1.0
        # Seconds per second of work in this attempt (1.0 on a speed-1 model, not spread).
        stretch = run.slowdown / run.speed
        if run.first_start is None:
            run.first_start = self.now
        run.ends_at = self.now + run.overhead + run.remaining_work * stretch
        heapq.heappush(self._ends, (run.ends_at, job_id, run.attempt))
        self.usage.change(spec.team, spec.gpu_equivalent, self.now)
        self.busy_gpus += spec.gpu_equivalent
        job = self.running[job_id] = running_job(run, self.now, stretch, self._requeueable(run))
        self._run_log.joined(job)
        return None

    def _keeps_progress(self, spec: JobSpec) -> bool:
        """Whether a preemption keeps the attempt's work: the job's own `checkpointed` (a
        trace column: whether it writes to FLEET_CHECKPOINT_DIR), else the config's."""
        if spec.checkpointed is not None:
            return spec.checkpointed
        return self.config.checkpointing

    def _requeueable(self, run: JobRun) -> bool:
        limit = self.config.max_requeues
        return limit is None or run.preemptions < limit

    def preempt(
        self, job_id: int, *, requeue: bool = True, free: bool = False, reason: str = ""
    ) -> str | None:
        """Stop a running job. `free` (the oracle's) keeps all progress and costs nothing."""
        run = self.jobs.get(job_id)
        if run is None or run.state != "running":
            return f"job {job_id} is not running"
        spec = run.spec
        ran = self.now - run.started_at
        g = spec.gpu_equivalent
        self._stop(run, ran)
        run.preemptions += 1
        self.preemptions += 1
        progress = max(0.0, ran - run.overhead) / run.slowdown * run.speed
        if free or self._keeps_progress(spec):
            run.done_work += progress
            run.lost_gpu_seconds += min(ran, run.overhead) * g
            run.spread_gpu_seconds += progress * (run.slowdown - 1.0) / run.speed * g
            run.overhead = 0.0 if free else self.config.restart_overhead
        else:
            run.lost_gpu_seconds += ran * g
            run.done_work = 0.0
            run.overhead = self.config.restart_overhead
        if requeue and (free or self._requeueable(run)):
            run.state = "pending"
            run.queued_at = self.now
            self._queue(run)
        else:
            run.state = "killed"
            run.finish = self.now
            self.finished += 1
        return None

    def _finish(self, run: JobRun, end: float) -> None:
        spec = run.spec
        self._stop(run, end - run.started_at)
        run.state = (
            "timeout" if spec.time_limit is not None and spec.duration > spec.time_limit else "done"
        )
        run.finish = end
        # Useful work of this attempt counts as used; its restart overhead is lost and what
        # the gang's spread cost is counted apart.
        run.spread_gpu_seconds += (
            run.remaining_work * (run.slowdown - 1.0) / run.speed * spec.gpu_equivalent
        )
        self._learn_speed(run, end)
        run.done_work = spec.work
        run.lost_gpu_seconds += run.overhead * spec.gpu_equivalent
        self.finished += 1
        ratio = spec.work / spec.time_limit if spec.time_limit else math.nan
        self.service.observe(spec.work * spec.gpu_equivalent, ratio)
        if self.predictor is not None:
            self.predictor.observe(spec, spec.work)

    def _learn_speed(self, run: JobRun, end: float) -> None:
        """What production learns from a finished job: its runtime against its time limit on
        the GPU model it ran on, from jobs that ran in one attempt on one model."""
        spec = run.spec
        if run.preemptions or not spec.time_limit or not self._learns_speeds:
            return
        models = {self._nodes[m.node].gpus[i].model for m in run.members for i in m.gpu_indices}
        if len(models) == 1:
            runtime = end - run.started_at - run.overhead
            self.speeds.observe(
                speed_key(spec.user, spec.name), models.pop(), runtime, spec.time_limit
            )

    def _stop(self, run: JobRun, ran: float) -> None:
        spec = run.spec
        g = spec.gpu_equivalent
        run.busy_gpu_seconds += ran * g
        run.attained += ran * g
        for m in run.members:
            self.gpus.take(spec, m.node, m.gpu_indices, +1)
        self.usage.change(spec.team, -g, self.now)
        self.busy_gpus -= g
        self._run_log.left(self.running.pop(run.spec.id))
        run.ends_at = math.inf

    def _pending_job(self, run: JobRun) -> PendingJob:
        return pending_job(run, self.config.declare_speeds)

    def snapshot(self) -> Snapshot:
        pending = tuple(self.pending.values())
        running = tuple(self.running.values())
        return Snapshot(
            now=self.now,
            nodes=self.gpus.node_states(),
            running=running,
            pending=pending,
            pending_changes=self._queue_log.changes(pending),
            running_changes=self._run_log.changes(running),
            teams=self.usage.states(self.now),
            settings=self._settings,
            service_distribution=self.service.atoms(),
            limit_ratio_distribution=self.service.ratio_atoms(),
            gpu_speeds=self.speeds.table(),
        )

    def mark_unschedulable(self) -> int:
        """End the jobs that can never start (nothing runs, nothing more arrives)."""
        ids = list(self.pending)
        for job_id in ids:
            run = self.jobs[job_id]
            run.state = "unschedulable"
            self._unqueue(job_id)
        return len(ids)
