"""/api/v1/scheduler/: the active policy, its parameters and the tick interval."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.serializers import StrictCharField, StrictSerializer
from fleet.errors import NotAllowed
from scheduler.cycle.config import (
    MAX_LIST_ITEMS,
    MAX_TICK_SECONDS,
    Param,
    known_params,
    settings_get,
    settings_update,
)
from scheduler.cycle.queries import last_cycle
from scheduler.models import CycleRecord, SchedulerSettings
from scheduler.policies import policy_names


class PolicyField(StrictCharField):
    """A policy name (checked by settings_update, which lists the known ones)."""


class ParamsField(serializers.JSONField):
    """Scheduler parameters: names to values (checked by settings_update)."""


def _param_schema(spec: Param) -> dict[str, Any]:
    bounds = {
        key: value
        for key, value in (("minimum", spec.minimum), ("maximum", spec.maximum))
        if value is not None
    }
    if spec.kind == "bool":
        schema: dict[str, Any] = {"type": "boolean"}
    elif spec.kind in ("int", "number"):
        schema = {"type": "integer" if spec.kind == "int" else "number", **bounds}
    elif spec.kind == "numbers":
        item = {"type": "number", **bounds}
        schema = {"type": "array", "items": item, "maxItems": MAX_LIST_ITEMS}
    elif spec.kind == "ranks":
        schema = {
            "type": "object",
            "additionalProperties": {"type": "integer", **bounds},
            "maxProperties": MAX_LIST_ITEMS,
        }
    else:
        schema = {"type": "string", **({"enum": list(spec.choices)} if spec.choices else {})}
    if spec.help:
        schema["description"] = spec.help
    return {**schema, "nullable": True}


class PolicyFieldSchema(OpenApiSerializerFieldExtension):
    target_class = "scheduler.api.settings.PolicyField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {"type": "string", "enum": policy_names(), "description": "The active policy."}


class ParamsFieldSchema(OpenApiSerializerFieldExtension):
    """Each parameter the policies read, with its type and range; null resets one."""

    target_class = "scheduler.api.settings.ParamsField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {k: _param_schema(p) for k, p in sorted(known_params().items())},
            "additionalProperties": False,
            "description": "Parameters to change (merged into the current ones; null resets one).",
        }


class CycleOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = CycleRecord
        ref_name = "SchedulerCycle"
        fields = [
            "id", "started_at", "finished_at", "duration_ms", "policy", "pending", "running",
            "placed", "preempted", "reserved", "skipped", "timings", "notes",
        ]  # fmt: skip


class SchedulerSettingsApi(APIView):
    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "SchedulerSettingsInput"

        policy = PolicyField(required=False, max_length=50)
        params = ParamsField(required=False)
        tick_seconds = serializers.IntegerField(
            required=False, min_value=1, max_value=MAX_TICK_SECONDS
        )

    class OutputSerializer(serializers.ModelSerializer):
        policies = serializers.SerializerMethodField()
        known_params = serializers.SerializerMethodField()
        last_cycle = serializers.SerializerMethodField()

        class Meta:
            model = SchedulerSettings
            ref_name = "SchedulerSettings"
            fields = [
                "policy", "params", "tick_seconds", "updated_at", "updated_by", "policies",
                "known_params", "last_cycle",
            ]  # fmt: skip

        def get_policies(self, row: SchedulerSettings) -> list[str]:
            return policy_names()

        def get_known_params(self, row: SchedulerSettings) -> dict[str, Any]:
            return {
                key: {
                    "type": spec.kind,
                    "default": spec.default,
                    "minimum": spec.minimum,
                    "maximum": spec.maximum,
                    "help": spec.help,
                }
                for key, spec in sorted(known_params().items())
            }

        @extend_schema(responses=CycleOutputSerializer(allow_null=True))  # type: ignore[misc]
        def get_last_cycle(self, row: SchedulerSettings) -> dict[str, Any] | None:
            record = last_cycle()
            return None if record is None else dict(CycleOutputSerializer(record).data)

    @extend_schema(responses=OutputSerializer)
    def get(self, request: Request) -> Response:
        return Response(self.OutputSerializer(settings_get()).data)

    @extend_schema(request=InputSerializer, responses=OutputSerializer)
    def patch(self, request: Request) -> Response:
        if not request.user.is_staff:
            raise NotAllowed("Only staff may change the scheduler's settings.")
        serializer = self.InputSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        row = settings_update(
            user=request.user,
            policy=data.get("policy"),
            params=data.get("params"),
            merge_params=True,
            tick_seconds=data.get("tick_seconds"),
        )
        return Response(self.OutputSerializer(row).data)
