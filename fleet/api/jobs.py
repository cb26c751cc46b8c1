"""/api/v1/jobs/: submit, list, inspect and act on jobs.

How a job is shown lives in fleet.api.job_output and what a submit takes in
fleet.api.job_submit (JobOutputSerializer and JobRequestInput import from here too)."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.job_output import JobOutputSerializer
from fleet.api.job_submit import (
    ArraySpecField,
    ArraySubmittedSerializer,
    JobRequestInput,
    array_submitted,
    lean_values,
)
from fleet.api.job_submitted import job_submitted
from fleet.api.serializers import (
    FALSE_WORDS,
    TRUE_WORDS,
    StrictCharField,
    StrictSerializer,
    check_query_params,
)
from fleet.models import Job, JobEvent, JobState
from fleet.selectors.checkpoints import attempts_resumed
from fleet.selectors.jobs import (
    job_events,
    job_get,
    job_list,
    job_reason_shown,
)
from fleet.services import job_arrays
from fleet.services import jobs as job_services


@extend_schema_field(OpenApiTypes.BOOL)
class FlagFilter(django_filters.CharFilter):
    """true/false (or 1/0, yes/no, on/off); the method refuses anything else."""


ID_MAX = 2**63 - 1  # ids are 64-bit columns


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": ID_MAX})
class WholeFilter(django_filters.CharFilter):
    """A whole number; the method checks its range and says what is wrong (400)."""


class JobFilter(django_filters.FilterSet):
    """Filters of the job list; a value that is not valid for its filter is a 400."""

    state = django_filters.MultipleChoiceFilter(choices=JobState.choices)
    team = django_filters.CharFilter(field_name="team__slug")
    owner = django_filters.CharFilter(field_name="owner__username")
    mine = FlagFilter(method="filter_mine", help_text="Only your own jobs.")
    array = WholeFilter(method="filter_array", help_text="Only the tasks of this job array.")

    class Meta:
        model = Job
        fields = ["state", "team", "owner", "mine", "array"]

    def filter_mine(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        word = value.strip().lower()
        if word not in TRUE_WORDS | FALSE_WORDS:
            raise ValidationError({"mine": [f"Give true or false; got {value!r}."]})
        return queryset.filter(owner=self.request.user) if word in TRUE_WORDS else queryset

    def filter_array(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        text = value.strip()
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= ID_MAX:
            raise ValidationError(
                {
                    "array": [
                        f"Give a job array's id, a whole number from 1 to {ID_MAX}; got {value!r}."
                    ]
                }
            )
        return queryset.filter(array_id=int(text))


LIST_PARAMS = ("state", "team", "owner", "mine", "array", "ordering", "page", "page_size")


class JobListApi(GenericAPIView):
    filterset_class = JobFilter
    ordering_fields = ["id", "submitted_at", "priority", "state", "started_at", "finished_at"]
    ordering = ["-id"]
    serializer_class = JobOutputSerializer

    class InputSerializer(JobRequestInput):
        class Meta:
            ref_name = "JobSubmitInput"

        array = ArraySpecField(
            required=False,
            help_text="Submit a job array: a count N (tasks 0..N-1), or indices such as "
            '"0-99", "0-99:4" or "1,3,5-7". Each task is a job with its own index.',
        )

    def get_queryset(self) -> QuerySet[Job]:
        return job_list(fetched_by=self.request.user)

    @extend_schema(responses=JobOutputSerializer(many=True))
    def get(self, request: Request) -> Response:
        check_query_params(request, LIST_PARAMS, repeatable=("state",))
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        started = [(job.pk, job.attempt) for job in page or () if job.attempt]
        context = {"request": request, "resumed": attempts_resumed(attempts=started)}
        data = JobOutputSerializer(page, many=True, context=context).data
        return self.get_paginated_response(data)

    @extend_schema(
        request=InputSerializer,
        responses={201: PolymorphicProxySerializer(
            component_name="JobSubmitted",
            serializers=[JobOutputSerializer, ArraySubmittedSerializer],
            resource_type_field_name=None,
        )},
        description="One job; with `array`, one job per index (the response is the array).",
    )  # fmt: skip
    def post(self, request: Request) -> Response:
        values = lean_values(self.InputSerializer, request.data)
        if values is None:  # anything the lean check cannot vouch for: the serializer decides
            serializer = self.InputSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            values = dict(serializer.validated_data)
        if "array" in values:
            spec = values.pop("array")
            job_array, tasks = job_arrays.job_array_submit(
                user=request.user, request=job_services.JobRequest(**values), array=spec
            )
            data = array_submitted(job_array, tasks)
            return Response(data, status=status.HTTP_201_CREATED)
        job = job_services.job_submit(user=request.user, request=job_services.JobRequest(**values))
        shown = job_submitted(job, request.user)
        if shown is None:
            shown = JobOutputSerializer(job, context={"request": request}).data
        return Response(shown, status=status.HTTP_201_CREATED)


class JobDetailApi(APIView):
    @extend_schema(responses=JobOutputSerializer)
    def get(self, request: Request, job_id: int) -> Response:
        job = job_get(job_id=job_id, fetched_by=request.user)
        return Response(JobOutputSerializer(job, context={"request": request}).data)


class _JobActionApi(APIView):
    action_name = ""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "JobActionInput"

        reason = StrictCharField(required=False, allow_blank=True, max_length=500)

    def post(self, request: Request, job_id: int) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        job = job_get(job_id=job_id, fetched_by=request.user)
        action = getattr(job_services, f"job_{self.action_name}")
        job = action(user=request.user, job=job, reason=serializer.validated_data.get("reason", ""))
        return Response(JobOutputSerializer(job, context={"request": request}).data)


def _action_api(name: str) -> type[APIView]:
    view = type(f"Job{name.title()}Api", (_JobActionApi,), {"action_name": name})
    return extend_schema(
        request=_JobActionApi.InputSerializer,
        responses=JobOutputSerializer,
        summary=f"{name.title()} a job (owner, team admins, staff).",
    )(view)


JobCancelApi = _action_api("cancel")
JobHoldApi = _action_api("hold")
JobReleaseApi = _action_api("release")
JobRequeueApi = _action_api("requeue")


class JobEventsApi(APIView):
    class OutputSerializer(serializers.ModelSerializer):
        reason = serializers.SerializerMethodField()

        class Meta:
            model = JobEvent
            ref_name = "JobEvent"
            fields = ["id", "at", "from_state", "to_state", "attempt", "reason", "actor_kind", "actor", "applied"]  # fmt: skip

        def get_reason(self, event: JobEvent) -> str:
            return job_reason_shown(
                job=self.context["job"], reason=event.reason, fetched_by=self.context["user"]
            )

    @extend_schema(responses=OutputSerializer(many=True))
    def get(self, request: Request, job_id: int) -> Response:
        job = job_get(job_id=job_id, fetched_by=request.user)
        context = {"job": job, "user": request.user}
        return Response(self.OutputSerializer(job_events(job=job), many=True, context=context).data)
