"""/api/v1/me/ and /api/v1/tokens/."""

from __future__ import annotations

from typing import cast

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from fleet.api.serializers import check_no_body
from fleet.models import Membership
from fleet.services.tokens import token_rotate


class MeApi(APIView):
    permission_classes = [IsAuthenticated]

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "Me"

        username = serializers.CharField()
        is_staff = serializers.BooleanField()
        teams = serializers.ListField(child=serializers.DictField())
        default_team = serializers.CharField(allow_null=True)

    @extend_schema(responses=OutputSerializer)
    def get(self, request: Request) -> Response:
        memberships = Membership.objects.filter(user_id=cast(int, request.user.pk)).select_related(
            "team"
        )
        teams = [{"slug": m.team.slug, "name": m.team.name, "role": m.role} for m in memberships]
        default = next((m.team.slug for m in memberships if m.is_default), None)
        data = {
            "username": request.user.get_username(),
            "is_staff": request.user.is_staff,
            "teams": teams,
            "default_team": default,
        }
        return Response(self.OutputSerializer(data).data)


class TokenApi(APIView):
    # Per user, counted in the cache (shared by every web process).
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "tokens"

    @extend_schema(
        request=None,
        responses={201: inline_serializer("TokenOutput", {"token": serializers.CharField()})},
        summary="Create or rotate your API token; the key is shown only in this response.",
    )
    def post(self, request: Request) -> Response:
        check_no_body(request)
        key = token_rotate(user=request.user)
        return Response({"token": key}, status=status.HTTP_201_CREATED)
