"""Jobs and their event history. Only fleet.services.job_states writes `Job.state`."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Mod
from django.db.models.lookups import Exact

from fleet.models.nodes import Node
from fleet.models.teams import Team
from scheduler.core.model import nodes_spanned

PRIORITY_MIN = -100
PRIORITY_MAX = 100


class JobState(models.TextChoices):
    PENDING = "pending", "pending"
    HELD = "held", "held"
    ASSIGNED = "assigned", "assigned"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    TIMEOUT = "timeout", "timeout"
    LOST = "lost", "lost"


ACTIVE_STATES = (JobState.ASSIGNED, JobState.RUNNING)
QUEUED_STATES = (JobState.PENDING, JobState.HELD)
FINAL_STATES = (
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.TIMEOUT,
)


class Qos(models.TextChoices):
    LOW = "low", "low"
    NORMAL = "normal", "normal"
    HIGH = "high", "high"


class JobArray(models.Model):
    """A Slurm-style job array: one submit that made `task_count` jobs, each a normal Job row
    with `array` and its own `array_index` (docs/arrays.md)."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="job_arrays"
    )
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="job_arrays")
    name = models.CharField(max_length=200)
    # The indices as the user wrote them ("0-99:2", "1,3,5-7", "16").
    spec = models.CharField(max_length=1000)
    task_count = models.PositiveIntegerField()
    submitted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(task_count__gt=0), name="job_array_task_count_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"array {self.pk} ({self.name})"


class Job(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    command = models.TextField()
    env = models.JSONField(default=dict, blank=True)
    workdir = models.CharField(max_length=1000, blank=True)

    # The request: whole GPUs (gpus >= 1) or a fraction of one (gpus == 0 with memory and
    # compute share).
    gpus = models.PositiveSmallIntegerField(default=1)
    gpu_memory_mb = models.PositiveIntegerField(null=True, blank=True)
    gpu_compute_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    # 0: every GPU on one node. Otherwise a multi-node gang of gpus // gpus_per_node members,
    # each on its own node with gpus_per_node GPUs (docs/gangs.md).
    gpus_per_node = models.PositiveSmallIntegerField(default=0)
    # Host CPU cores and memory per member (per node); 0 asks for none. Submission fills in
    # the team's per-GPU defaults when the job does not ask.
    cpus = models.PositiveIntegerField(default=0)
    memory_mb = models.PositiveIntegerField(default=0)
    # Every member in one topology group (Node.group); otherwise only preferred.
    same_group = models.BooleanField(default=False)
    gpu_model = models.CharField(max_length=100, blank=True)
    min_gpu_memory_mb = models.PositiveIntegerField(null=True, blank=True)
    time_limit = models.PositiveIntegerField(help_text="Seconds.")
    priority = models.SmallIntegerField(default=0)
    qos = models.CharField(max_length=10, choices=Qos.choices, default=Qos.NORMAL)
    preemptible = models.BooleanField(default=False)
    max_requeues = models.PositiveSmallIntegerField(default=3)

    state = models.CharField(
        max_length=10, choices=JobState.choices, default=JobState.PENDING, editable=False
    )
    state_reason = models.CharField(max_length=1000, blank=True)
    attempt = models.PositiveIntegerField(default=0, editable=False)
    requeues = models.PositiveIntegerField(default=0, editable=False)
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    # The node the current attempt was dispatched to; unlike `node`, kept when the job goes
    # back to the queue, so a success that attempt reports late can still be recognised.
    attempt_node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    gpu_indices = models.JSONField(default=list, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)

    submitted_at = models.DateTimeField(auto_now_add=True, db_index=True)
    assigned_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    # Written by the scheduling cycle for pending jobs.
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    eta = models.DateTimeField(null=True, blank=True)

    # A task of a job array: the array and this task's index in it (both set, or neither).
    array = models.ForeignKey(
        JobArray,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="tasks",
        editable=False,
    )
    array_index = models.PositiveIntegerField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["state", "submitted_at"]),
            models.Index(fields=["team", "state"]),
            models.Index(fields=["owner", "state"]),
            models.Index(fields=["node", "state"]),
            models.Index(fields=["finished_at"]),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(gpus__gte=1, gpu_memory_mb__isnull=True, gpu_compute_percent__isnull=True)
                    | Q(
                        gpus=0,
                        gpu_memory_mb__gt=0,
                        gpu_compute_percent__gte=1,
                        gpu_compute_percent__lte=100,
                    )
                ),
                name="job_whole_gpus_xor_fraction",
            ),
            models.CheckConstraint(condition=Q(time_limit__gt=0), name="job_time_limit_positive"),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="job_priority_bounded",
            ),
            models.CheckConstraint(
                condition=Q(min_gpu_memory_mb__isnull=True) | Q(min_gpu_memory_mb__gt=0),
                name="job_min_gpu_memory_positive",
            ),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in JobState]), name="job_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(gpus_per_node=0)
                | Q(
                    Q(gpus__gte=F("gpus_per_node")),
                    Exact(Mod(F("gpus"), F("gpus_per_node")), 0),
                    gpus_per_node__gt=0,
                ),
                name="job_gpus_multiple_of_gpus_per_node",
            ),
            models.CheckConstraint(
                condition=Q(array__isnull=True, array_index__isnull=True)
                | Q(array__isnull=False, array_index__isnull=False),
                name="job_array_and_index_together",
            ),
            models.UniqueConstraint(fields=["array", "array_index"], name="job_array_index_unique"),
        ]

    # Set on the instance that the state machine returns: what the job was just before the
    # transition, so callers can stop the attempt that ran. Not stored.
    previous_state: str = ""
    previous_attempt: int = 0
    previous_node_id: int | None = None
    previous_gpu_indices: tuple[int, ...] = ()

    def __str__(self) -> str:
        return f"job {self.pk} ({self.name})"

    @property
    def array_label(self) -> str:
        """`array_id[index]` for a task of an array, else the job id."""
        if self.array_id is None:
            return str(self.pk)
        return f"{self.array_id}[{self.array_index}]"

    @property
    def is_fractional(self) -> bool:
        return self.gpus == 0

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def nodes(self) -> int:
        """How many nodes the job spans (1 unless it is a multi-node gang)."""
        return nodes_spanned(self.gpus, self.gpus_per_node)

    @property
    def is_gang(self) -> bool:
        return self.nodes > 1


class MemberState(models.TextChoices):
    ASSIGNED = "assigned", "assigned"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    # Told to stop because the attempt is over (another member failed, cancel, requeue...).
    STOPPED = "stopped", "stopped"


class JobMember(models.Model):
    """One node's share of one attempt: rank 0 is the job's own node and GPUs
    (`Job.node`, `Job.gpu_indices`); a multi-node gang has one row per node, all written in
    the transaction that dispatches the attempt. A gang never puts two members on one
    node, so (job, attempt, node) names a member as well as (job, attempt, rank)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="members")
    attempt = models.PositiveIntegerField()
    rank = models.PositiveSmallIntegerField()
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="members"
    )
    gpu_indices = models.JSONField(default=list, blank=True)
    state = models.CharField(
        max_length=10, choices=MemberState.choices, default=MemberState.ASSIGNED
    )
    pid = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Rank 0's rendezvous port for this attempt, chosen when its start is first sent (free
    # among the ports of other live attempts on the node) and named again by every start
    # sent for it; null on other ranks.
    master_port = models.PositiveIntegerField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["job", "attempt", "rank"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "rank"], name="job_member_unique_rank"
            ),
            models.UniqueConstraint(
                fields=["job", "attempt", "node"], name="job_member_unique_node"
            ),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in MemberState]),
                name="job_member_state_valid",
            ),
        ]
        indexes = [models.Index(fields=["node", "state"])]

    def __str__(self) -> str:
        return f"job {self.job_id}.{self.attempt} rank {self.rank}"


class ActorKind(models.TextChoices):
    USER = "user", "user"
    SCHEDULER = "scheduler", "scheduler"
    NODE = "node", "node"
    SYSTEM = "system", "system"


class JobEvent(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    from_state = models.CharField(max_length=10, choices=JobState.choices, blank=True)
    to_state = models.CharField(max_length=10, choices=JobState.choices)
    attempt = models.PositiveIntegerField()
    reason = models.CharField(max_length=1000, blank=True)
    actor_kind = models.CharField(max_length=10, choices=ActorKind.choices)
    actor = models.CharField(max_length=150, blank=True, help_text="User name or node name.")
    # False for a report that was recorded but not applied (stale attempt, duplicate).
    applied = models.BooleanField(default=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "id"])]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_state} -> {self.to_state}"
