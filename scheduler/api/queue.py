"""/api/v1/queue/: waiting jobs in the active policy's order, and the running ones."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.serializers import QueryBooleanField, QuerySerializer, StrictCharField
from fleet.models import Job
from fleet.selectors.jobs import job_state_reason
from scheduler.cycle.config import settings_get
from scheduler.cycle.queries import last_cycle, queue_pending, queue_running
from scheduler.cycle.queue_order import queue_waits

MAX_LIMIT = 5000


class QueueJobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    team = serializers.CharField(source="team.slug")
    queue_position = serializers.SerializerMethodField(
        help_text="Place in the active policy's order as of the last cycle (1: next); null "
        "while the job is not pending or no cycle has seen it yet."
    )
    node = serializers.SerializerMethodField()
    pending_reason = serializers.SerializerMethodField()

    class Meta:
        model = Job
        ref_name = "QueueJob"
        fields = [
            "id", "name", "owner", "team", "state", "gpus", "gpu_memory_mb",
            "gpu_compute_percent", "gpu_model", "priority", "qos", "preemptible", "time_limit",
            "submitted_at", "queue_position", "eta", "pending_reason", "node", "gpu_indices",
            "assigned_at", "started_at", "array_id", "array_index",
        ]  # fmt: skip

    def get_node(self, job: Job) -> str | None:
        return job.node.name if job.node_id and job.node else None

    def get_queue_position(self, job: Job) -> int | None:
        return getattr(job, "shown_position", None) if job.state == "pending" else None

    def get_pending_reason(self, job: Job) -> str | None:
        if job.state != "pending":
            return None
        reason = job_state_reason(
            job=job, fetched_by=self.context["request"].user, waits=self.context.get("queue_waits")
        )
        return reason or "waiting for the scheduler's next cycle"


class QueueApi(APIView):
    class InputSerializer(QuerySerializer):
        class Meta:
            ref_name = "QueueQuery"

        mine = QueryBooleanField(required=False, help_text="Only your own jobs.")
        team = StrictCharField(
            required=False, max_length=50, help_text="Only this team's jobs (its slug)."
        )
        limit = serializers.IntegerField(
            required=False,
            min_value=0,
            max_value=MAX_LIMIT,
            default=500,
            help_text=f"Pending jobs listed (default 500, at most {MAX_LIMIT}).",
        )

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "Queue"

        policy = serializers.CharField()
        cycle_at = serializers.DateTimeField(allow_null=True)
        pending_count = serializers.IntegerField()
        pending = QueueJobSerializer(many=True)
        running = QueueJobSerializer(many=True)

    @extend_schema(
        parameters=[InputSerializer],
        responses=OutputSerializer,
    )
    def get(self, request: Request) -> Response:
        query = self.InputSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        mine = query.validated_data.get("mine", False)
        team = query.validated_data.get("team") or None
        limit = query.validated_data["limit"]
        waits = queue_waits()
        count, pending = queue_pending(
            fetched_by=request.user, mine=mine, team=team, limit=limit, waits=waits
        )
        running = queue_running(fetched_by=request.user, mine=mine, team=team)
        cycle = last_cycle()
        data = {
            "policy": settings_get().policy,
            "cycle_at": cycle.finished_at if cycle else None,
            "pending_count": count,
            "pending": pending,
            "running": list(running),
        }
        context = {"request": request, "queue_waits": waits}
        return Response(self.OutputSerializer(data, context=context).data)
