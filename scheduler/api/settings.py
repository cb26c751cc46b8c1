"""/api/v1/scheduler/: the active policy, its parameters and the tick interval."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.serializers import StrictCharField, StrictSerializer
from fleet.errors import NotAllowed
from scheduler.cycle.config import MAX_TICK_SECONDS, known_params, settings_get, settings_update
from scheduler.cycle.queries import last_cycle
from scheduler.models import CycleRecord, SchedulerSettings
from scheduler.policies import policy_names


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

        policy = StrictCharField(
            required=False, max_length=50, help_text="One of the listed policies."
        )
        params = serializers.JSONField(
            required=False,
            help_text="Parameters to change (merged into the current ones; null removes one).",
        )
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
