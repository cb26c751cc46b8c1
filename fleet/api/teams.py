"""/api/v1/teams/: quotas and weights (staff edit them); per-GPU host defaults and idle-GPU
settings (the team's admins edit them too)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.serializers import (
    INT_MAX,
    StrictCharField,
    StrictSerializer,
    check_query_params,
)
from fleet.errors import NotAllowed
from fleet.models import Team
from fleet.selectors.teams import team_get, team_list
from fleet.services.access import admin_team_ids
from fleet.services.teams import IDLE_ACTIONS, TEAM_ADMIN_FIELDS, team_update

# Weights scale a team's priority and fair share: positive (team_update checks), finite, and
# within a range where the scheduler's arithmetic stays meaningful.
MAX_WEIGHT = 1_000_000.0
# Bounds that keep a per-GPU default a plausible amount before the fleet's nodes are asked
# (team_update refuses more than the largest node offers).
MAX_CPUS_PER_GPU = 4096
MAX_MEMORY_MB_PER_GPU = 64 * 1024 * 1024


class TeamOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Team
        fields = [
            "slug", "name", "priority_weight", "fairshare_weight", "guaranteed_gpus",
            "gpu_limit", "user_gpu_cap", "default_time_limit", "max_time_limit",
            "cpus_per_gpu", "memory_mb_per_gpu", "cpu_limit", "memory_mb_limit",
            "idle_util_percent", "idle_minutes", "idle_action",
        ]  # fmt: skip


class TeamListApi(APIView):
    @extend_schema(responses=TeamOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        check_query_params(request, ())
        return Response(TeamOutputSerializer(team_list(fetched_by=request.user), many=True).data)


class TeamDetailApi(APIView):
    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "TeamUpdateInput"

        name = StrictCharField(required=False, max_length=100)
        priority_weight = serializers.FloatField(
            required=False, max_value=MAX_WEIGHT, help_text="Greater than 0."
        )
        fairshare_weight = serializers.FloatField(
            required=False, max_value=MAX_WEIGHT, help_text="Greater than 0."
        )
        guaranteed_gpus = serializers.IntegerField(required=False, min_value=0, max_value=INT_MAX)
        gpu_limit = serializers.IntegerField(
            required=False, min_value=0, max_value=INT_MAX, allow_null=True
        )
        user_gpu_cap = serializers.IntegerField(
            required=False, min_value=1, max_value=INT_MAX, allow_null=True
        )
        default_time_limit = serializers.IntegerField(
            required=False, min_value=1, max_value=INT_MAX, help_text="Seconds."
        )
        max_time_limit = serializers.IntegerField(
            required=False, min_value=1, max_value=INT_MAX, help_text="Seconds."
        )
        cpus_per_gpu = serializers.IntegerField(
            required=False,
            min_value=0,
            max_value=MAX_CPUS_PER_GPU,
            help_text="Host CPU cores a job gets per GPU on each node when it does not ask; "
            "0: none. At most what the largest node offers.",
        )
        memory_mb_per_gpu = serializers.IntegerField(
            required=False,
            min_value=0,
            max_value=MAX_MEMORY_MB_PER_GPU,
            help_text="MB of host memory a job gets per GPU on each node when it does not ask; "
            "0: none. At most what the largest node offers.",
        )
        cpu_limit = serializers.IntegerField(
            required=False,
            min_value=1,
            max_value=INT_MAX,
            allow_null=True,
            help_text="Host CPU cores the team's running jobs may hold, over all their nodes; "
            "null: no limit.",
        )
        memory_mb_limit = serializers.IntegerField(
            required=False,
            min_value=1,
            max_value=INT_MAX,
            allow_null=True,
            help_text="MB of host memory the team's running jobs may hold, over all their "
            "nodes; null: no limit.",
        )
        idle_util_percent = serializers.FloatField(
            required=False,
            min_value=0,
            max_value=100,
            help_text="A job's GPUs under this utilization (%) count as idle.",
        )
        idle_minutes = serializers.IntegerField(
            required=False,
            min_value=0,
            max_value=INT_MAX,
            help_text="Minutes of idle GPUs before a job is flagged; 0: off.",
        )
        idle_action = serializers.ChoiceField(
            required=False,
            choices=IDLE_ACTIONS,
            error_messages={
                "invalid_choice": 'idle_action must be "warn" (flag and notify) or "stop" '
                '(also cancel the job), not "{input}".'
            },
            help_text="warn: flag and notify; stop: also cancel the job.",
        )

    @extend_schema(responses=TeamOutputSerializer)
    def get(self, request: Request, slug: str) -> Response:
        return Response(TeamOutputSerializer(team_get(slug=slug, fetched_by=request.user)).data)

    @extend_schema(request=InputSerializer, responses=TeamOutputSerializer)
    def patch(self, request: Request, slug: str) -> Response:
        team = team_get(slug=slug, fetched_by=request.user)
        if not request.user.is_staff:
            if team.pk not in admin_team_ids(request.user):
                raise NotAllowed("Only staff and the team's admins may change a team's settings.")
            beyond = (
                sorted(set(request.data) - set(TEAM_ADMIN_FIELDS))
                if isinstance(request.data, dict)
                else []
            )
            if beyond:
                raise NotAllowed(
                    f"A team admin may change {', '.join(TEAM_ADMIN_FIELDS)}; only staff may "
                    f"change {', '.join(beyond)} (quotas, limits and weights)."
                )
        serializer = self.InputSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        team = team_update(team=team, data=serializer.validated_data)
        return Response(TeamOutputSerializer(team).data)
