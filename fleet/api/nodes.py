"""/api/v1/nodes/: the fleet's hosts and GPUs; drain and resume for staff."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.permissions import IsStaff
from fleet.api.serializers import (
    StrictCharField,
    StrictSerializer,
    check_no_body,
    check_query_params,
)
from fleet.models import Gpu, Node
from fleet.selectors.nodes import active_shares, gpu_jobs, node_get, node_list, node_usage
from fleet.selectors.telemetry import gpu_latest_samples
from fleet.services.nodes import node_drain, node_resume


class GpuLatestSampleSerializer(serializers.Serializer):
    """The GPU's latest telemetry sample (from the cache), or null when none is recent."""

    class Meta:
        ref_name = "GpuLatestSample"

    util_percent = serializers.FloatField(allow_null=True)
    memory_used_mb = serializers.IntegerField(allow_null=True)
    memory_total_mb = serializers.IntegerField()
    temperature_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    sampled_at = serializers.DateTimeField()


class GpuOutputSerializer(serializers.ModelSerializer):
    jobs = serializers.SerializerMethodField()
    latest = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = ["index", "uuid", "model", "memory_mb", "jobs", "latest"]

    @extend_schema_field(GpuLatestSampleSerializer(allow_null=True))
    def get_latest(self, gpu: Gpu) -> dict[str, Any] | None:
        sample = self.context.get("latest", {}).get(gpu.uuid)
        return GpuLatestSampleSerializer(sample).data if sample else None

    def get_jobs(self, gpu: Gpu) -> list[dict[str, Any]]:
        holders = self.context.get("holders", {}).get((gpu.node_id, gpu.index), [])
        return [
            {"id": j.pk, "name": j.name, "owner": j.owner.username, "team": j.team.slug}
            for j in holders
        ]


class NodeUsageSerializer(serializers.Serializer):
    """What is booked on the node: the GPUs, CPU cores and MB of host memory of the jobs
    (members of multi-node jobs) assigned or running there, and of stopping attempts until
    their end is reported."""

    class Meta:
        ref_name = "NodeUsage"

    gpus = serializers.IntegerField()
    cpus = serializers.IntegerField()
    memory_mb = serializers.IntegerField()


class NodeOutputSerializer(serializers.ModelSerializer):
    gpus = GpuOutputSerializer(many=True)
    simulated = serializers.SerializerMethodField()
    cpus = serializers.IntegerField(
        allow_null=True, help_text="CPU cores the agent offers jobs (null: not yet registered)."
    )
    memory_mb = serializers.IntegerField(
        allow_null=True, help_text="MB of host memory the agent offers jobs."
    )
    address = serializers.CharField(help_text="Where the other members of a gang reach it.")
    group = serializers.CharField(help_text="Topology group (rack, switch); empty: none.")
    resource_enforcement = serializers.CharField(
        help_text=(
            '"cgroup-v2" when jobs are held to their CPUs and memory, else "none: why"; then '
            '"; mps: <pipe directory>" when CUDA MPS enforces fractional shares, or "; mps: none: why".'
        )
    )
    used = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "name", "state", "state_reason", "last_heartbeat", "labels", "agent_version",
            "gpu_backend", "simulated", "cpus", "memory_mb", "address", "group",
            "resource_enforcement", "used", "gpus",
        ]  # fmt: skip

    def get_simulated(self, node: Node) -> bool:
        return node.gpu_backend == "simulated"

    @extend_schema_field(NodeUsageSerializer)
    def get_used(self, node: Node) -> dict[str, int]:
        empty = {"gpus": 0, "cpus": 0, "memory_mb": 0}
        return dict(self.context.get("usage", {}).get(node.pk, empty))


def _render(nodes: list[Node], many: bool) -> Any:
    shares = active_shares(nodes)
    latest = gpu_latest_samples([g for n in nodes for g in n.gpus.all()])
    context = {
        "holders": gpu_jobs(nodes, shares=shares),
        "latest": latest,
        "usage": node_usage(nodes, shares=shares),
    }
    data = NodeOutputSerializer(nodes, many=True, context=context).data
    return data if many else data[0]


class NodeListApi(APIView):
    @extend_schema(responses=NodeOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        check_query_params(request, ())
        return Response(_render(list(node_list()), many=True))


class NodeDetailApi(APIView):
    @extend_schema(responses=NodeOutputSerializer)
    def get(self, request: Request, name: str) -> Response:
        return Response(_render([node_get(name=name)], many=False))


class NodeDrainApi(APIView):
    permission_classes = [IsStaff]

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "NodeDrainInput"

        reason = StrictCharField(required=False, allow_blank=True, max_length=500)

    @extend_schema(request=InputSerializer, responses=NodeOutputSerializer)
    def post(self, request: Request, name: str) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = node_drain(
            node=node_get(name=name),
            user=request.user,
            reason=serializer.validated_data.get("reason", ""),
        )
        return Response(_render([node], many=False))


class NodeResumeApi(APIView):
    permission_classes = [IsStaff]

    @extend_schema(request=None, responses=NodeOutputSerializer)
    def post(self, request: Request, name: str) -> Response:
        check_no_body(request)
        node = node_resume(node=node_get(name=name), user=request.user)
        return Response(_render([node], many=False))
