"""/api/v1/teams/: quotas and weights (staff edit them)."""

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
from fleet.services.teams import team_update

# Weights scale a team's priority and fair share: positive (team_update checks), finite, and
# within a range where the scheduler's arithmetic stays meaningful.
MAX_WEIGHT = 1_000_000.0


class TeamOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = Team
        fields = [
            "slug", "name", "priority_weight", "fairshare_weight", "guaranteed_gpus",
            "gpu_limit", "user_gpu_cap", "default_time_limit", "max_time_limit",
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

    @extend_schema(responses=TeamOutputSerializer)
    def get(self, request: Request, slug: str) -> Response:
        return Response(TeamOutputSerializer(team_get(slug=slug, fetched_by=request.user)).data)

    @extend_schema(request=InputSerializer, responses=TeamOutputSerializer)
    def patch(self, request: Request, slug: str) -> Response:
        if not request.user.is_staff:
            raise NotAllowed("Only staff may change a team's quotas and weights.")
        serializer = self.InputSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        team = team_update(
            team=team_get(slug=slug, fetched_by=request.user), data=serializer.validated_data
        )
        return Response(TeamOutputSerializer(team).data)
