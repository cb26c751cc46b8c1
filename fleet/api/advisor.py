"""/api/v1/advisor/: the policy advisor (staff only).

- `GET trace.csv?days=N`: the last N days of recorded jobs as a fleet trace
  (`python -m scheduler.sim --trace it.csv --format fleet`).
- `POST runs/` {"days": N}: 202 with the run's id; one run at a time.
- `GET runs/<id>/`: progress (done/total) and, once done, the metrics side by side.
- `POST runs/<id>/apply/` {"candidate": k}: make candidate k's policy and weights the
  scheduler's settings (refused when the settings changed since the run started).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.urls import path
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.permissions import IsStaff
from fleet.api.schema import ErrorSerializer
from fleet.api.serializers import QuerySerializer, StrictSerializer
from scheduler.advisor import history, runs
from scheduler.api.settings import SchedulerSettingsApi


class DaysField(serializers.IntegerField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(min_value=1, max_value=history.MAX_DAYS, **kwargs)


class AdvisorTraceApi(APIView):
    permission_classes = [IsStaff]

    class QueryInput(QuerySerializer):
        days = DaysField(required=False, default=7)

    @extend_schema(
        parameters=[QueryInput],
        responses={(200, "text/csv"): OpenApiResponse(OpenApiTypes.STR)},
    )
    def get(self, request: Request) -> HttpResponse:
        query = self.QueryInput(data=request.query_params)
        query.is_valid(raise_exception=True)
        days = query.validated_data["days"]
        now = timezone.now()
        export = history.recorded_jobs(days=days, now=now)
        response = HttpResponse(history.trace_csv(export), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="fleet-trace-{days}d.csv"'
        # What the simulator needs besides the jobs: the cluster as a --cluster spec.
        response["X-Fleet-Cluster"] = history.fleet_cluster().spec.text
        return response


class RunOutputSerializer(serializers.Serializer):
    class Meta:
        ref_name = "AdvisorRun"

    id = serializers.CharField()
    state = serializers.ChoiceField(choices=["queued", "running", "done", "failed"])
    days = serializers.IntegerField()
    jobs_in_window = serializers.IntegerField()
    created_at = serializers.CharField()
    created_by = serializers.CharField()
    cluster = serializers.CharField()
    policy = serializers.CharField(help_text="The active policy when the run started.")
    params = serializers.JSONField()
    settings_seen = serializers.CharField()
    done = serializers.IntegerField()
    total = serializers.IntegerField()
    actual = serializers.JSONField(allow_null=True, help_text="What happened: its metrics.")
    candidates = serializers.JSONField(
        help_text="Per candidate: index, policy, params, label, metrics (or error)."
    )
    best = serializers.JSONField(required=False, help_text="Per metric, the best rows.")
    notes = serializers.ListField(child=serializers.CharField())
    error = serializers.CharField(allow_blank=True)
    applied = serializers.JSONField(allow_null=True)


class AdvisorRunListApi(APIView):
    permission_classes = [IsStaff]

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "AdvisorRunInput"

        days = DaysField(required=False, default=7)

    @extend_schema(
        request=InputSerializer,
        responses={
            202: RunOutputSerializer,
            409: OpenApiResponse(ErrorSerializer, description="A run is already in progress."),
        },
    )
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = runs.advisor_run_start(user=request.user, days=serializer.validated_data["days"])
        return Response(RunOutputSerializer(run).data, status=status.HTTP_202_ACCEPTED)


class AdvisorRunDetailApi(APIView):
    permission_classes = [IsStaff]

    @extend_schema(responses=RunOutputSerializer)
    def get(self, request: Request, run_id: str) -> Response:
        return Response(RunOutputSerializer(runs.advisor_run_get(run_id=run_id)).data)


class AdvisorRunApplyApi(APIView):
    permission_classes = [IsStaff]

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "AdvisorApplyInput"

        candidate = serializers.IntegerField(min_value=0, max_value=1000)

    @extend_schema(
        request=InputSerializer,
        responses=SchedulerSettingsApi.OutputSerializer,
        parameters=[OpenApiParameter("run_id", str, OpenApiParameter.PATH)],
    )
    def post(self, request: Request, run_id: str) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        row = runs.advisor_run_apply(
            run_id=run_id, candidate=serializer.validated_data["candidate"], user=request.user
        )
        return Response(SchedulerSettingsApi.OutputSerializer(row).data)


urlpatterns = [
    path("trace.csv", AdvisorTraceApi.as_view(), name="advisor-trace"),
    path("runs/", AdvisorRunListApi.as_view(), name="advisor-runs"),
    path("runs/<str:run_id>/", AdvisorRunDetailApi.as_view(), name="advisor-run"),
    path("runs/<str:run_id>/apply/", AdvisorRunApplyApi.as_view(), name="advisor-run-apply"),
]
