"""POST /api/v1/jobs/estimate/: where and when a job would start if submitted now."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.job_submit import JobRequestInput
from fleet.services.jobs import JobRequest
from scheduler.cycle.queries import job_estimate


class JobEstimateApi(APIView):
    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "JobEstimate"

        would_start_now = serializers.BooleanField()
        node = serializers.CharField(allow_null=True)
        estimated_start = serializers.DateTimeField(allow_null=True)
        reason = serializers.CharField()
        policy = serializers.CharField()
        team = serializers.CharField()

    @extend_schema(
        request=JobRequestInput,
        responses=OutputSerializer,
        summary="Estimate a submission's start without submitting it (nothing is written).",
    )
    def post(self, request: Request) -> Response:
        serializer = JobRequestInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        estimate = job_estimate(user=request.user, request=JobRequest(**serializer.validated_data))
        return Response(self.OutputSerializer(estimate).data)
