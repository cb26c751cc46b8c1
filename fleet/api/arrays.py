"""/api/v1/jobs/bulk/ and /api/v1/arrays/: many jobs in one request (docs/arrays.md)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import APIView

from fleet.api.errors import _first_message
from fleet.api.job_submit import lean_values
from fleet.api.jobs import JobRequestInput
from fleet.api.serializers import StrictCharField, StrictSerializer
from fleet.errors import ApplicationError
from fleet.models.jobs import JobArray
from fleet.services import job_arrays
from fleet.services.jobs import JobRequest


class JobBulkApi(APIView):
    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "JobBulkInput"

        # Items are checked one by one in the view, so a refusal names the item's index.
        jobs = serializers.ListField(
            child=serializers.JSONField(),
            allow_empty=False,
            help_text="Job requests, each as POST /api/v1/jobs/ takes one (without array).",
        )

    class OutputSerializer(serializers.Serializer):
        count = serializers.IntegerField()
        job_ids = serializers.ListField(
            child=serializers.IntegerField(), help_text="In the order of the request."
        )

        class Meta:
            ref_name = "JobBulkSubmitted"

    @extend_schema(
        request=InputSerializer,
        responses={201: OutputSerializer},
        summary="Submit many jobs at once: all of them, or none when one is refused.",
    )
    def post(self, request: Request) -> Response:
        outer = self.InputSerializer(data=request.data)
        outer.is_valid(raise_exception=True)
        items = outer.validated_data["jobs"]
        cap = job_arrays.max_bulk_jobs()
        if len(items) > cap:
            message = (
                f"The request has {len(items)} jobs; at most {cap} are allowed in one bulk "
                "submit. Send them in several requests."
            )
            raise ApplicationError(message, {"fields": {"jobs": [message]}})
        requests: list[JobRequest] = []
        # One serializer for every item, as a ListSerializer does: building one per item
        # (DRF deep-copies its fields) cost more than the rest of the request.
        # A plain item is checked by the lean check of single submits; the serializer decides
        # the rest, and words every refusal.
        child = JobRequestInput()
        for index, item in enumerate(items):
            try:
                values = lean_values(JobRequestInput, item) or child.run_validation(item)
            except ValidationError as exc:
                errors: Any = as_serializer_error(exc)
                field = next(iter(errors), "")
                where = f"jobs[{index}]" + (
                    f".{field}" if field and field != "non_field_errors" else ""
                )
                message = f"{where}: {_first_message(errors[field]) if field else errors}"
                extra = {"index": index, "fields": {"jobs": [message]}, "item_fields": dict(errors)}
                raise ApplicationError(message, extra) from exc
            requests.append(JobRequest(**values))
        jobs = job_arrays.jobs_submit_many(user=request.user, requests=requests)
        data = {"count": len(jobs), "job_ids": [job.pk for job in jobs]}
        return Response(data, status=status.HTTP_201_CREATED)


class ArrayOutputSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    team = serializers.CharField(source="team.slug")
    array = serializers.CharField(source="spec", help_text="The indices as submitted.")
    states = serializers.SerializerMethodField(help_text="How many tasks are in each state.")

    class Meta:
        model = JobArray
        ref_name = "JobArray"
        fields = ["id", "name", "owner", "team", "array", "task_count", "submitted_at", "states"]

    def get_states(self, job_array: JobArray) -> dict[str, int]:
        return job_arrays.job_array_states(job_array=job_array)


class ArrayDetailApi(APIView):
    @extend_schema(responses=ArrayOutputSerializer)
    def get(self, request: Request, array_id: int) -> Response:
        job_array = job_arrays.job_array_get(array_id=array_id, fetched_by=request.user)
        return Response(ArrayOutputSerializer(job_array).data)


class ArrayCancelApi(APIView):
    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "ArrayCancelInput"

        reason = StrictCharField(required=False, allow_blank=True, max_length=500)

    class OutputSerializer(ArrayOutputSerializer):
        cancelled = serializers.SerializerMethodField(help_text="Tasks this request cancelled.")

        class Meta(ArrayOutputSerializer.Meta):
            ref_name = "JobArrayCancelled"
            fields = [*ArrayOutputSerializer.Meta.fields, "cancelled"]

        def get_cancelled(self, job_array: JobArray) -> int:
            return int(self.context["cancelled"])

    @extend_schema(
        request=InputSerializer,
        responses=OutputSerializer,
        summary="Cancel every task of a job array that has not ended (owner, team admins, staff).",
    )
    def post(self, request: Request, array_id: int) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        job_array = job_arrays.job_array_get(array_id=array_id, fetched_by=request.user)
        cancelled = job_arrays.job_array_cancel(
            user=request.user,
            job_array=job_array,
            reason=serializer.validated_data.get("reason", ""),
        )
        data = self.OutputSerializer(job_array, context={"cancelled": cancelled}).data
        return Response(data)
