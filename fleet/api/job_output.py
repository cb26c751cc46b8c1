"""How the jobs API shows a job: JobOutputSerializer (and its members)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet.models import Job, JobMember, JobState
from fleet.models.jobs import QUEUED_STATES
from fleet.selectors.checkpoints import attempt_resumed
from fleet.selectors.jobs import job_members, job_state_reason
from fleet.services.access import can_manage_job, can_see_command
from scheduler.cycle.eta_learning import band_for, current_calibration
from scheduler.cycle.queue_order import QueueWaits, queue_waits


class JobMemberSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", allow_null=True, default=None)

    class Meta:
        model = JobMember
        fields = [
            "rank", "node", "gpu_indices", "state", "exit_code", "started_at", "finished_at"
        ]  # fmt: skip


class JobOutputSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    team = serializers.CharField(source="team.slug")
    node = serializers.CharField(source="node.name", allow_null=True, default=None)
    state_reason = serializers.SerializerMethodField()
    pending_reason = serializers.SerializerMethodField()
    queue_position = serializers.SerializerMethodField()
    eta = serializers.SerializerMethodField()
    eta_band = serializers.SerializerMethodField(
        help_text="While pending with an ETA: [earliest, latest], the start is 80% likely "
        "to fall inside (calibrated on how this fleet's earlier forecasts turned out)."
    )
    command = serializers.SerializerMethodField()
    env = serializers.SerializerMethodField()
    workdir = serializers.SerializerMethodField()
    can_manage = serializers.SerializerMethodField()
    nodes = serializers.IntegerField(read_only=True, help_text="Nodes the job spans.")
    resumed = serializers.SerializerMethodField(
        help_text="Whether the current attempt resumed from a checkpoint (true), started "
        "fresh (false), or null: not started, or its node keeps no checkpoints."
    )
    members = serializers.SerializerMethodField(
        help_text="The current attempt's share of each node, rank 0 first (empty while the "
        "job waits)."
    )

    class Meta:
        model = Job
        fields = [
            "id", "name", "owner", "team", "state", "state_reason", "pending_reason",
            "attempt", "requeues", "gpus", "gpu_memory_mb", "gpu_compute_percent",
            "gpu_model", "min_gpu_memory_mb", "time_limit", "priority", "qos", "preemptible",
            "max_requeues", "node", "gpu_indices", "exit_code", "submitted_at", "assigned_at",
            "started_at", "finished_at", "queue_position", "eta", "eta_band", "command", "env", "workdir",
            "can_manage", "gpus_per_node", "nodes", "cpus", "memory_mb", "same_group", "members",
            "resumed",
            "array_id", "array_index",
        ]  # fmt: skip

    def _user(self) -> Any:
        return self.context["request"].user

    def _waits(self) -> QueueWaits:
        """The stored queue order: read once per response, not once per job."""
        waits = self.context.get("queue_waits")
        if waits is None:
            waits = self.context["queue_waits"] = queue_waits()
        return waits

    def get_state_reason(self, job: Job) -> str:
        return job_state_reason(job=job, fetched_by=self._user(), waits=self._waits())

    # The scheduling cycle writes these for pending jobs; other states show none.
    def get_pending_reason(self, job: Job) -> str | None:
        if job.state != JobState.PENDING:
            return None
        return self.get_state_reason(job) or "waiting for the scheduler's next cycle"

    def get_queue_position(self, job: Job) -> int | None:
        if job.state != JobState.PENDING:
            return None
        return self._waits().position(job.pk)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_eta(self, job: Job) -> str | None:
        if job.state != JobState.PENDING or job.eta is None:
            return None
        return serializers.DateTimeField().to_representation(job.eta)

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField(), allow_null=True))
    def get_eta_band(self, job: Job) -> list[str] | None:
        if job.state != JobState.PENDING or job.eta is None:
            return None
        calibration = self.context.get("eta_calibration")
        if calibration is None:  # read once per response, not once per job
            calibration = self.context["eta_calibration"] = current_calibration()
        band = band_for(job.eta, timezone.now(), calibration)
        if band is None:
            return None
        return [serializers.DateTimeField().to_representation(t) for t in band]

    def get_command(self, job: Job) -> str | None:
        return job.command if can_see_command(self._user(), job) else None

    def get_env(self, job: Job) -> dict[str, str] | None:
        return job.env if can_manage_job(self._user(), job) else None

    def get_workdir(self, job: Job) -> str | None:
        return job.workdir if can_see_command(self._user(), job) else None

    def get_can_manage(self, job: Job) -> bool:
        return can_manage_job(self._user(), job)

    @extend_schema_field(serializers.BooleanField(allow_null=True))
    def get_resumed(self, job: Job) -> bool | None:
        if not job.attempt or job.state in QUEUED_STATES:
            return None
        known = self.context.get("resumed")  # a list reads every job's in one query
        if known is not None and job.pk in known:
            return known[job.pk]
        return attempt_resumed(job_id=job.pk, attempt=job.attempt)

    @extend_schema_field(JobMemberSerializer(many=True))
    def get_members(self, job: Job) -> list[dict[str, Any]]:
        if job.state in QUEUED_STATES:
            return []
        rows = job_members(job=job)
        return list(JobMemberSerializer(rows, many=True).data)
