"""/api/v1/me/notifications/: the caller's notification settings and recent deliveries."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.serializers import StrictSerializer
from fleet.models import Notification, NotificationEvent
from fleet.services.notifications import settings_get, settings_update

EVENTS = [e.value for e in NotificationEvent]
RECENT = 50


class EventsSerializer(StrictSerializer):
    start = serializers.BooleanField(required=False)
    end = serializers.BooleanField(required=False)
    failure = serializers.BooleanField(required=False)
    time_limit = serializers.BooleanField(required=False)
    requeue = serializers.BooleanField(required=False)
    idle = serializers.BooleanField(required=False)


class NotificationOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    job = serializers.IntegerField(source="job_id")
    attempt = serializers.IntegerField()
    event = serializers.CharField()
    channel = serializers.CharField()
    target = serializers.CharField()
    state = serializers.CharField()
    tries = serializers.IntegerField()
    last_error = serializers.CharField()
    created_at = serializers.DateTimeField()
    sent_at = serializers.DateTimeField(allow_null=True)


def settings_data(user: Any) -> dict[str, Any]:
    """The caller's settings and their latest deliveries, as the API and the page show them."""
    prefs = settings_get(user=user)
    recent = Notification.objects.filter(user_id=user.pk).order_by("-created_at", "-id")[:RECENT]
    return {
        "webhook_url": prefs.webhook_url,
        "email": prefs.email,
        "email_address": user.email,
        "events": {e: prefs.wants(e) for e in EVENTS},
        "recent": NotificationOutputSerializer(recent, many=True).data,
    }


class NotificationSettingsApi(APIView):
    permission_classes = [IsAuthenticated]

    class InputSerializer(StrictSerializer):
        webhook_url = serializers.CharField(required=False, allow_blank=True, max_length=500)
        email = serializers.BooleanField(required=False)
        events = EventsSerializer(required=False)

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "NotificationSettings"

        webhook_url = serializers.CharField()
        email = serializers.BooleanField()
        email_address = serializers.CharField()
        events = serializers.DictField(child=serializers.BooleanField())
        recent = NotificationOutputSerializer(many=True)

    @extend_schema(responses=OutputSerializer, summary="Your notification settings.")
    def get(self, request: Request) -> Response:
        return Response(settings_data(request.user))

    @extend_schema(
        request=InputSerializer,
        responses=OutputSerializer,
        summary="Change your notification settings; fields left out keep their values.",
    )
    def put(self, request: Request) -> Response:
        given = self.InputSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        data = dict(given.validated_data)
        for event, on in (data.pop("events", None) or {}).items():
            data[f"on_{event}"] = on
        settings_update(user=request.user, data=data)
        return Response(settings_data(request.user))
