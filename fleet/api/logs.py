"""/api/v1/jobs/{id}/logs/: a job's output, read in pieces, one member (rank) at a time
(owner, team admins, staff)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.serializers import INT_MAX, QuerySerializer
from fleet.errors import NotAllowed
from fleet.selectors.jobs import job_get
from fleet.selectors.telemetry import job_log_read
from fleet.services.access import can_manage_job


class JobLogsApi(APIView):
    class InputSerializer(QuerySerializer):
        class Meta:
            ref_name = "JobLogsQuery"

        offset = serializers.IntegerField(
            required=False,
            min_value=0,
            max_value=2**63 - 1,
            default=0,
            help_text="Byte offset to read from (default 0).",
        )
        attempt = serializers.IntegerField(
            required=False,
            min_value=1,
            max_value=INT_MAX,
            help_text="Attempt (default: the latest).",
        )
        rank = serializers.IntegerField(
            required=False,
            min_value=0,
            max_value=INT_MAX,
            default=0,
            help_text="Member of a multi-node job whose output to read (default 0; the "
            "response's ranks lists them).",
        )

    # A schema-only serializer: a field named "data" would shadow Serializer.data, so the
    # response is the selector's dict as it is.
    OUTPUT = inline_serializer(
        name="JobLogs",
        fields={
            "data": serializers.CharField(help_text="Output from offset (UTF-8, at most 64 KiB)."),
            "offset": serializers.IntegerField(),
            "next_offset": serializers.IntegerField(help_text="Pass as offset to read on."),
            "complete": serializers.BooleanField(
                help_text="The attempt has ended and all its output has been read."
            ),
            "attempt": serializers.IntegerField(),
            "rank": serializers.IntegerField(help_text="The member whose output this is."),
            "ranks": serializers.ListField(
                child=serializers.IntegerField(),
                help_text="Members of the attempt whose output can be read.",
            ),
        },
    )

    @extend_schema(
        parameters=[InputSerializer],
        responses=OUTPUT,
    )
    def get(self, request: Request, job_id: int) -> Response:
        query = self.InputSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        job = job_get(job_id=job_id, fetched_by=request.user)
        if not can_manage_job(request.user, job):
            raise NotAllowed("Only the job's owner, its team's admins and staff may read its logs.")
        log = job_log_read(
            job=job,
            offset=query.validated_data["offset"],
            attempt=query.validated_data.get("attempt"),
            rank=query.validated_data["rank"],
        )
        return Response(log)
