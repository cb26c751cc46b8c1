"""/api/v1/nodes/{name}/telemetry/: GPU history of one node, raw or one-minute rollups."""

from __future__ import annotations

from datetime import UTC, datetime

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.serializers import SMALL_INT_MAX, QuerySerializer
from fleet.errors import ApplicationError
from fleet.selectors.nodes import node_get
from fleet.selectors.telemetry import telemetry_history

# Time bounds a query may name (a range reaching year 1 or 9999 overflows date arithmetic).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


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
    class InputSerializer(QuerySerializer):
        class Meta:
            ref_name = "NodeTelemetryQuery"

        gpu = serializers.IntegerField(
            required=False,
            min_value=0,
            max_value=SMALL_INT_MAX,
            help_text="GPU index on this node (default: all).",
        )
        since = serializers.DateTimeField(
            required=False, help_text="ISO 8601 (default: until - 1 h)."
        )
        until = serializers.DateTimeField(required=False, help_text="ISO 8601 (default: now).")

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
        parameters=[InputSerializer],
        responses=OutputSerializer,
    )
    def get(self, request: Request, name: str) -> Response:
        query = self.InputSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        since, until = params.get("since"), params.get("until")
        for key, value in (("since", since), ("until", until)):
            if value is not None and not EARLIEST <= value <= LATEST:
                message = f"{key} must lie between {EARLIEST:%Y} and {LATEST:%Y}."
                raise ApplicationError(message, {"fields": {key: [message]}})
        if since and until and since > until:
            message = "since must not be after until."
            raise ApplicationError(message, {"fields": {"since": [message]}})
        node = node_get(name=name)
        gpu = params.get("gpu")
        if gpu is not None and not node.gpus.filter(index=gpu).exists():
            indices = sorted(node.gpus.values_list("index", flat=True))
            known = ", ".join(map(str, indices)) or "none"
            message = f"Node {node.name} has no GPU {gpu}; its GPU indices: {known}."
            raise ApplicationError(message, {"fields": {"gpu": [message]}})
        history = telemetry_history(node=node, gpu_index=gpu, since=since, until=until)
        return Response(self.OutputSerializer(history).data)
