"""/api/v1/nodes/{name}/telemetry/: GPU history of one node, raw or one-minute rollups."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.errors import ApplicationError
from fleet.selectors.nodes import node_get
from fleet.selectors.telemetry import telemetry_history


class TelemetryPointSerializer(serializers.Serializer):
    class Meta:
        ref_name = "TelemetryPoint"

    t = serializers.DateTimeField(help_text="Sample time, or the start of the minute.")
    util_percent = serializers.FloatField(allow_null=True)
    memory_used_mb = serializers.FloatField(allow_null=True)
    memory_total_mb = serializers.IntegerField()
    temperature_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    util_percent_max = serializers.FloatField(required=False, allow_null=True)


class TelemetryGpuSerializer(serializers.Serializer):
    class Meta:
        ref_name = "TelemetryGpu"

    index = serializers.IntegerField()
    uuid = serializers.CharField()
    points = TelemetryPointSerializer(many=True)


class NodeTelemetryApi(APIView):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "NodeTelemetryQuery"

        gpu = serializers.IntegerField(required=False, min_value=0)
        since = serializers.DateTimeField(required=False)
        until = serializers.DateTimeField(required=False)

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "NodeTelemetry"

        node = serializers.CharField()
        resolution = serializers.ChoiceField(
            choices=["raw", "1m"],
            help_text="raw samples within the raw retention window, else 1-minute averages",
        )
        since = serializers.DateTimeField()
        until = serializers.DateTimeField()
        gpus = TelemetryGpuSerializer(many=True)

    @extend_schema(
        parameters=[
            OpenApiParameter("gpu", int, description="GPU index (default: all)"),
            OpenApiParameter("since", str, description="ISO 8601 (default: until - 1 h)"),
            OpenApiParameter("until", str, description="ISO 8601 (default: now)"),
        ],
        responses=OutputSerializer,
    )
    def get(self, request: Request, name: str) -> Response:
        query = self.InputSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        since, until = params.get("since"), params.get("until")
        if since and until and since > until:
            raise ApplicationError("since must not be after until.")
        history = telemetry_history(
            node=node_get(name=name), gpu_index=params.get("gpu"), since=since, until=until
        )
        return Response(self.OutputSerializer(history).data)
