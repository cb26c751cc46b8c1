"""GPU hosts and their GPUs. Which GPU, CPU core or megabyte of host memory is busy is
derived from assigned/running jobs (their members) and from stopping attempts' holds."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class NodeState(models.TextChoices):
    UP = "up", "up"
    DRAINING = "draining", "draining"
    DOWN = "down", "down"


class Node(models.Model):
    name = models.CharField(max_length=100, unique=True)
    state = models.CharField(max_length=10, choices=NodeState.choices, default=NodeState.UP)
    state_reason = models.CharField(max_length=500, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    agent_version = models.CharField(max_length=50, blank=True)
    # "nvml" or "simulated": the UI and API say plainly when a node's GPUs are simulated.
    gpu_backend = models.CharField(max_length=20, blank=True)
    heartbeat_timeout = models.PositiveIntegerField(default=30, help_text="Seconds.")
    # The agent's lease (workers/lease.py), as it reports it: its jobs stop this long after
    # the control side last heard it, so they are declared lost only after that.
    lease_seconds = models.PositiveIntegerField(default=180, editable=False)
    # The agent's clock reading in the newest heartbeat or registration applied: an older
    # one, reordered by the broker, is out of date and stops or loses nothing.
    agent_clock = models.FloatField(null=True, blank=True, editable=False)
    # An admin's drain, kept apart from liveness: a draining node that goes down and comes
    # back is still draining.
    drain_requested = models.BooleanField(default=False)
    # Public half of the node's key (Ed25519, URL-safe base64). The agent holds the private
    # half (`manage.py add_node NAME` prints it once) and signs every message with it; the
    # control side refuses a message its public key does not verify (workers/wire.py).
    public_key = models.CharField(max_length=64, blank=True, editable=False)
    # What the agent offers jobs of its host, as it registers (None: an agent that does not
    # say; then CPUs and memory limit nothing on this node).
    cpus = models.PositiveIntegerField(null=True, blank=True, editable=False)
    memory_mb = models.PositiveIntegerField(null=True, blank=True, editable=False)
    # How the members of a multi-node job reach this host (MASTER_ADDR, FLEET_NODELIST).
    address = models.CharField(max_length=255, blank=True, editable=False)
    # Topology group (rack, switch): a gang prefers, or requires, members in one group.
    group = models.CharField(max_length=100, blank=True, editable=False)
    # "cgroup-v2" when the agent confines each job's CPUs and memory; otherwise "none: why".
    resource_enforcement = models.CharField(max_length=300, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["state"])]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=100, unique=True)
    model = models.CharField(max_length=100)
    memory_mb = models.PositiveIntegerField()

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node"),
            models.CheckConstraint(condition=Q(memory_mb__gt=0), name="gpu_memory_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index} ({self.model})"


class GpuRelease(models.Model):
    """GPUs that a stopping attempt still holds.

    When a job leaves assigned/running because of a cancel, a requeue or a preemption, the
    database frees its GPUs at once, but its process lives on for its grace period (SIGTERM,
    then SIGKILL). Until the agent reports that attempt's end, or the hold expires, the
    scheduler counts these GPUs as busy, so a new job never lands on a GPU whose old job is
    still checkpointing."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="releases")
    job = models.ForeignKey("fleet.Job", on_delete=models.CASCADE, related_name="releases")
    attempt = models.PositiveIntegerField()
    gpu_indices = models.JSONField(default=list)
    gpus = models.PositiveSmallIntegerField()
    gpu_memory_mb = models.PositiveIntegerField(null=True, blank=True)
    gpu_compute_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    # Host CPUs and memory the attempt's member on this node still holds.
    cpus = models.PositiveIntegerField(default=0)
    memory_mb = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    # The waiting job a preemption stopped this attempt for: until the hold ends, the
    # scheduler lets that job wait for these GPUs instead of preempting again for it.
    for_job = models.ForeignKey(
        "fleet.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            # One hold per member: a multi-node attempt holds GPUs on each of its nodes.
            models.UniqueConstraint(
                fields=["job", "attempt", "node"], name="gpu_release_one_per_member"
            )
        ]
        indexes = [models.Index(fields=["expires_at"])]

    def __str__(self) -> str:
        return (
            f"job {self.job_id}.{self.attempt} releasing {self.gpu_indices} on node {self.node_id}"
        )
