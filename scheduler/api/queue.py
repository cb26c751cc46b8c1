"""/api/v1/queue/: waiting jobs in the active policy's order, and the running ones."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.models import Job
from scheduler.cycle.config import settings_get
from scheduler.cycle.queries import last_cycle, queue_pending, queue_running

MAX_LIMIT = 5000
TRUE = {"1", "true", "yes", "on"}


class QueueJobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    team = serializers.CharField(source="team.slug")
    node = serializers.SerializerMethodField()
    pending_reason = serializers.SerializerMethodField()

    class Meta:
        model = Job
        ref_name = "QueueJob"
        fields = [
            "id", "name", "owner", "team", "state", "gpus", "gpu_memory_mb",
            "gpu_compute_percent", "gpu_model", "priority", "qos", "preemptible", "time_limit",
            "submitted_at", "queue_position", "eta", "pending_reason", "node", "gpu_indices",
            "assigned_at", "started_at",
        ]  # fmt: skip

    def get_node(self, job: Job) -> str | None:
        return job.node.name if job.node_id and job.node else None

    def get_pending_reason(self, job: Job) -> str | None:
        if job.state != "pending":
            return None
        return job.state_reason or "waiting for the scheduler's next cycle"


class QueueApi(APIView):
    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "Queue"

        policy = serializers.CharField()
        cycle_at = serializers.DateTimeField(allow_null=True)
        pending_count = serializers.IntegerField()
        pending = QueueJobSerializer(many=True)
        running = QueueJobSerializer(many=True)

    @extend_schema(
        parameters=[
            OpenApiParameter("mine", OpenApiTypes.BOOL, description="Only your own jobs."),
            OpenApiParameter("team", OpenApiTypes.STR, description="Only this team's jobs."),
            OpenApiParameter(
                "limit", OpenApiTypes.INT, description=f"Pending jobs listed (max {MAX_LIMIT})."
            ),
        ],
        responses=OutputSerializer,
    )
    def get(self, request: Request) -> Response:
        mine = request.query_params.get("mine", "").strip().lower() in TRUE
        team = request.query_params.get("team") or None
        try:
            limit = max(0, min(int(request.query_params.get("limit", 500)), MAX_LIMIT))
        except ValueError:
            limit = 500
        pending = queue_pending(fetched_by=request.user, mine=mine, team=team)
        running = queue_running(fetched_by=request.user, mine=mine, team=team)
        cycle = last_cycle()
        data = {
            "policy": settings_get().policy,
            "cycle_at": cycle.finished_at if cycle else None,
            "pending_count": pending.count(),
            "pending": list(pending[:limit]),
            "running": list(running),
        }
        return Response(self.OutputSerializer(data).data)
