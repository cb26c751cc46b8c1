"""Snapshot (what the scheduler sees) and plan (what it decides), as frozen dataclasses.

Times are seconds since the epoch as floats (the simulator starts at 0); `Snapshot.now` is
the only clock a policy may use. A job asks either for whole GPUs (`gpus >= 1`) or for a
fraction of one GPU (`gpus == 0` with `gpu_memory_mb` and `gpu_compute_percent`).

Whole GPUs sit on one node unless the job names `gpus_per_node`: then it is a gang of
`gpus // gpus_per_node` members, each on its own node with `gpus_per_node` GPUs, placed
all at once or not at all. A placement's first member (rank 0) is `node` and
`gpu_indices`; the others are `members`, in rank order. `cpus` and `memory_mb` are asked
per member (per node); a node that does not report its CPUs or memory (None) is not
limited by them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

FULL_COMPUTE = 100


def is_mig_device(model: str) -> bool:
    """Whether a GPU model names a MIG device ("A100-80GB MIG 3g.40gb", as agents report
    them: docs/mig.md). A CUDA process uses one MIG device, so a job that needs several
    GPUs on one node cannot run on MIG devices."""
    return " MIG " in f" {model} "


def nodes_spanned(gpus: int, gpus_per_node: int) -> int:
    """How many nodes a job of `gpus` GPUs, `gpus_per_node` on each (0: all on one node),
    spans: 1 unless it is a multi-node gang."""
    if gpus_per_node and gpus > gpus_per_node:
        return gpus // gpus_per_node
    return 1


@dataclass(frozen=True, slots=True)
class GpuState:
    index: int
    model: str
    memory_mb: int
    # What running jobs leave of this GPU. A GPU is wholly free when nothing runs on it.
    free_memory_mb: int
    free_compute_percent: int = FULL_COMPUTE

    @property
    def is_whole_free(self) -> bool:
        return self.free_compute_percent >= FULL_COMPUTE and self.free_memory_mb >= self.memory_mb


@dataclass(frozen=True, slots=True)
class Member:
    """One node's share of a placement: the node and the GPUs the job takes there."""

    node: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    gpus: tuple[GpuState, ...]
    # Only schedulable nodes (state "up") take new work; draining and down nodes are listed
    # so that reasons and ETAs can speak of them.
    schedulable: bool = True
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Host CPU cores and memory, and what running jobs leave of them; None when the node
    # does not report them (then they limit nothing).
    cpus: int | None = None
    memory_mb: int | None = None
    free_cpus: int | None = None
    free_memory_mb: int | None = None
    # Topology group (rack, switch): a gang prefers members in one group.
    group: str = ""


@dataclass(frozen=True, slots=True)
class PendingJob:
    id: int
    team: str
    user: str
    submitted_at: float
    time_limit: float
    gpus: int = 1
    gpu_memory_mb: int | None = None
    gpu_compute_percent: int | None = None
    gpu_model: str | None = None
    min_gpu_memory_mb: int | None = None
    priority: int = 0
    qos: str = "normal"
    preemptible: bool = True
    name: str = ""
    # Predicted runtime from history (see scheduler.core.prediction); None when unknown,
    # in which case policies fall back to the time limit.
    predicted_runtime: float | None = None
    # Seconds of GPU work already done by earlier attempts (for least-attained-service).
    attained_service: float = 0.0
    # 0: every GPU on one node. Otherwise a gang of gpus // gpus_per_node members.
    gpus_per_node: int = 0
    # Per member (per node); 0 asks for none.
    cpus: int = 0
    memory_mb: int = 0
    # Members must share one topology group (the admin requires it); otherwise preferred.
    same_group: bool = False
    # Times the job was stopped and requeued (preemption cap), and when it last entered
    # the queue (None: at submit), for starvation guards.
    preemptions: int = 0
    queued_at: float | None = None
    # Relative speed per GPU model as the job declares it, (model, speed) pairs such as
    # (("V100", 1.0), ("K80", 0.3)); (): not declared (see Snapshot.gpu_speeds).
    gpu_speeds: tuple[tuple[str, float], ...] = ()

    @property
    def is_fractional(self) -> bool:
        return self.gpus == 0

    @property
    def nodes(self) -> int:
        """How many nodes the job spans (1 unless it is a multi-node gang)."""
        return nodes_spanned(self.gpus, self.gpus_per_node)

    @property
    def gpus_on_each_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def expected_runtime(self) -> float:
        if self.predicted_runtime is None:
            return self.time_limit
        return min(self.predicted_runtime, self.time_limit)

    @property
    def gpu_equivalent(self) -> float:
        """Whole GPUs for gangs; the compute share for a fraction (0.25 for 25 %)."""
        if self.gpus:
            return float(self.gpus)
        return (self.gpu_compute_percent or 0) / FULL_COMPUTE


@dataclass(frozen=True, slots=True)
class RunningJob:
    id: int
    team: str
    user: str
    node: str
    gpu_indices: tuple[int, ...]
    started_at: float
    time_limit: float
    gpus: int = 1
    gpu_memory_mb: int | None = None
    gpu_compute_percent: int | None = None
    priority: int = 0
    qos: str = "normal"
    preemptible: bool = True
    predicted_runtime: float | None = None
    # Whether another requeue is allowed (attempts left under max_requeues).
    requeueable: bool = True
    # Seconds of GPU work done by earlier attempts (least-attained-service adds this run).
    attained_service: float = 0.0
    # Members after the first (rank 0 is node, gpu_indices), for a multi-node gang.
    members: tuple[Member, ...] = ()
    gpus_per_node: int = 0
    cpus: int = 0
    memory_mb: int = 0
    # Times the job was stopped and requeued before this attempt (preemption cap), and when
    # it entered the queue before this attempt (None: unknown).
    preemptions: int = 0
    queued_at: float | None = None
    # Whether the job keeps a checkpoint it resumes from (a preemption then loses only the
    # time since its last checkpoint); None: unknown, the preemption settings decide.
    checkpointed: bool | None = None

    @property
    def is_fractional(self) -> bool:
        return self.gpus == 0

    @property
    def allocations(self) -> tuple[Member, ...]:
        """Every member, rank 0 first."""
        return (Member(self.node, self.gpu_indices), *self.members)

    @property
    def limit_end(self) -> float:
        return self.started_at + self.time_limit

    @property
    def expected_end(self) -> float:
        if self.predicted_runtime is None:
            return self.limit_end
        return self.started_at + min(self.predicted_runtime, self.time_limit)

    @property
    def gpu_equivalent(self) -> float:
        if self.gpus:
            return float(self.gpus)
        return (self.gpu_compute_percent or 0) / FULL_COMPUTE


@dataclass(frozen=True, slots=True)
class TeamState:
    slug: str
    guaranteed_gpus: int = 0
    hard_limit_gpus: int | None = None  # None: no hard limit beyond the fleet
    user_gpu_cap: int | None = None
    priority_weight: float = 1.0
    fairshare_weight: float = 1.0
    # Decayed GPU-seconds used (half-life applied by whoever builds the snapshot).
    decayed_usage: float = 0.0
    # Host CPU cores and memory (MB) the team's jobs may hold, summed over every node of
    # every job; None: no limit.
    hard_limit_cpus: int | None = None
    hard_limit_memory_mb: int | None = None


@dataclass(frozen=True, slots=True)
class PendingChanges:
    """What changed in the queue since a driver's previous snapshot, from a driver that
    carries its (frozen) PendingJob objects over (the simulator): that snapshot's very
    `pending` tuple, the job objects that joined since and those that left. A policy may
    bring what it keeps per queued job up to date from it instead of comparing queues."""

    before: tuple[PendingJob, ...]
    added: tuple[PendingJob, ...]
    removed: tuple[PendingJob, ...]


@dataclass(frozen=True, slots=True)
class RunningChanges:
    """What changed among the running jobs since a driver's previous snapshot, as
    `PendingChanges` says it of the queue: that snapshot's very `running` tuple, the job
    objects that started since and those that stopped."""

    before: tuple[RunningJob, ...]
    added: tuple[RunningJob, ...]
    removed: tuple[RunningJob, ...]

    def keys_against(
        self, held: Mapping[int, RunningJob], running: tuple[RunningJob, ...]
    ) -> tuple[list[int], list[int]] | None:
        """The keys (`id()`) of the jobs that stopped and of those that started, when these
        changes take `held` (the jobs a structure holds, by `id()`) to `running`: every
        stopped job held, no started one held, none twice; None otherwise (the caller then
        compares the lists as a whole)."""
        if len(running) != len(held) - len(self.removed) + len(self.added):
            return None
        gone = [id(r) for r in self.removed]
        pairs = zip(gone, self.removed, strict=True)
        if len(set(gone)) != len(gone) or any(held.get(k) is not r for k, r in pairs):
            return None
        new = [id(r) for r in self.added]
        if len(set(new)) != len(new) or any(k in held for k in new):
            return None
        return gone, new


class Occupant(NamedTuple):
    """Something holding GPU capacity until `end`: a running job, a fresh placement or the
    hold of a stopping attempt (`Snapshot.holds`), as the reservation search and the
    forecast read them (a named tuple: a cycle makes one per placement and per running
    job's member, and a tuple is made several times faster than a frozen dataclass)."""

    end: float
    node: str
    gpu_indices: tuple[int, ...]
    gpus: int
    gpu_memory_mb: int | None = None
    gpu_compute_percent: int | None = None
    # Host CPUs and memory it holds on the node.
    cpus: int = 0
    memory_mb: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[NodeState, ...]
    running: tuple[RunningJob, ...] = ()
    pending: tuple[PendingJob, ...] = ()
    teams: Mapping[str, TeamState] = field(default_factory=lambda: MappingProxyType({}))
    # Policy parameters edited by admins (weights, half-life, preemption switches...).
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # Sizes (GPU-seconds) of recently finished jobs as equal-mass atoms, sorted
    # (scheduler.core.service_distribution.summarize); () when unknown. Used by gittins.
    service_distribution: tuple[float, ...] = ()
    # Runtime / time limit of the same finished jobs, as equal-mass atoms in (0, 1]; () when
    # unknown. With it, gittins sees each job's size as its limit x GPUs times this ratio.
    limit_ratio_distribution: tuple[float, ...] = ()
    # Relative speed per GPU model learned from finished jobs' runtimes: job class (see
    # scheduler.policies.gavel.speed_key) -> GPU model -> speed, the fastest model of a
    # class at 1.0; empty when unknown. Used by gavel.
    gpu_speeds: Mapping[str, Mapping[str, float]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # Pending job id -> the nodes where jobs preempted for it still hold GPUs (stopping
    # within their grace period). Such a job waits for them instead of preempting again:
    # production frees a victim's GPUs only once its process has ended, and every cycle in
    # between would otherwise preempt another set of victims for the same job. Empty where
    # preemption frees GPUs at once (the simulator).
    releasing_for: Mapping[int, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # How many jobs preempted in earlier cycles are still stopping: they count against
    # settings "max_preemptions_per_cycle", which so bounds the preemptions in flight. A
    # production cycle runs every few seconds and on every event, several within one grace
    # period; the simulator frees GPUs at once and leaves it 0.
    preemptions_stopping: int = 0
    # What attempts that are still stopping hold (cancelled, requeued or preempted jobs
    # within their grace period), each until the time it is given back at the latest. The
    # nodes already count these GPUs as taken; the reservation search and the forecast
    # read here when they come back. Empty where stopping frees GPUs at once (the
    # simulator).
    holds: tuple[Occupant, ...] = ()
    # The queue's changes since the driver's previous snapshot, where it knows them.
    pending_changes: PendingChanges | None = field(default=None, compare=False, repr=False)
    # The running jobs' changes since the driver's previous snapshot, where it knows them.
    running_changes: RunningChanges | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Place:
    job_id: int
    node: str
    gpu_indices: tuple[int, ...]
    reason: str = ""
    # Members after the first, for a multi-node gang (rank order).
    members: tuple[Member, ...] = ()

    @property
    def allocations(self) -> tuple[Member, ...]:
        """Every member, rank 0 first."""
        return (Member(self.node, self.gpu_indices), *self.members)


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: int
    reason: str
    # Requeue (pending, attempt + 1) when allowed; otherwise the job ends.
    requeue: bool = True
    # The waiting job the victim makes room for (its reason names it too), so the driver
    # can tell later snapshots which job the GPUs being released are for
    # (`Snapshot.releasing_for`).
    for_job: int | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Reserve:
    job_id: int
    node: str
    start: float
    gpu_indices: tuple[int, ...] = ()
    # Further nodes held for a multi-node gang.
    members: tuple[Member, ...] = ()


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: int
    # A sentence with numbers: "needs 4 GPUs on one node; the largest free block is 2 on sim-a".
    reason: str
    eta: float | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    policy: str
    places: tuple[Place, ...] = ()
    preempts: tuple[Preempt, ...] = ()
    reserves: tuple[Reserve, ...] = ()
    waits: tuple[Wait, ...] = ()
    # Pending job ids in the policy's order (queue position = index + 1).
    order: tuple[int, ...] = ()
    # Free-form remarks, for example "ilp: solver time limit hit, fell back to greedy".
    notes: tuple[str, ...] = ()
