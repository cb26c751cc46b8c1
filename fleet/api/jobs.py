"""/api/v1/jobs/: submit, list, inspect and act on jobs."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.api.serializers import (
    FALSE_WORDS,
    INT_MAX,
    TRUE_WORDS,
    StrictCharField,
    StrictSerializer,
    check_query_params,
)
from fleet.models import Job, JobEvent, JobMember, JobState
from fleet.models.jobs import PRIORITY_MAX, PRIORITY_MIN, QUEUED_STATES, JobArray, Qos
from fleet.selectors.checkpoints import attempt_resumed, attempts_resumed
from fleet.selectors.jobs import (
    job_events,
    job_get,
    job_list,
    job_members,
    job_reason_shown,
    job_state_reason,
)
from fleet.services import job_arrays
from fleet.services import jobs as job_services
from fleet.services.access import can_manage_job, can_see_command
from scheduler.cycle.eta_learning import band_for, current_calibration


class JobMemberSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", allow_null=True, default=None)

    class Meta:
        model = JobMember
        fields = [
            "rank", "node", "gpu_indices", "state", "exit_code", "started_at", "finished_at"
        ]  # fmt: skip


class JobOutputSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    team = serializers.CharField(source="team.slug")
    node = serializers.CharField(source="node.name", allow_null=True, default=None)
    state_reason = serializers.SerializerMethodField()
    pending_reason = serializers.SerializerMethodField()
    queue_position = serializers.SerializerMethodField()
    eta = serializers.SerializerMethodField()
    eta_band = serializers.SerializerMethodField(
        help_text="While pending with an ETA: [earliest, latest], the start is 80% likely "
        "to fall inside (calibrated on how this fleet's earlier forecasts turned out)."
    )
    command = serializers.SerializerMethodField()
    env = serializers.SerializerMethodField()
    workdir = serializers.SerializerMethodField()
    can_manage = serializers.SerializerMethodField()
    nodes = serializers.IntegerField(read_only=True, help_text="Nodes the job spans.")
    resumed = serializers.SerializerMethodField(
        help_text="Whether the current attempt resumed from a checkpoint (true), started "
        "fresh (false), or null: not started, or its node keeps no checkpoints."
    )
    members = serializers.SerializerMethodField(
        help_text="The current attempt's share of each node, rank 0 first (empty while the "
        "job waits)."
    )

    class Meta:
        model = Job
        fields = [
            "id", "name", "owner", "team", "state", "state_reason", "pending_reason",
            "attempt", "requeues", "gpus", "gpu_memory_mb", "gpu_compute_percent",
            "gpu_model", "min_gpu_memory_mb", "time_limit", "priority", "qos", "preemptible",
            "max_requeues", "node", "gpu_indices", "exit_code", "submitted_at", "assigned_at",
            "started_at", "finished_at", "queue_position", "eta", "eta_band", "command", "env", "workdir",
            "can_manage", "gpus_per_node", "nodes", "cpus", "memory_mb", "same_group", "members",
            "resumed",
            "array_id", "array_index",
        ]  # fmt: skip

    def _user(self) -> Any:
        return self.context["request"].user

    def get_state_reason(self, job: Job) -> str:
        return job_state_reason(job=job, fetched_by=self._user())

    # The scheduling cycle writes these for pending jobs; other states show none.
    def get_pending_reason(self, job: Job) -> str | None:
        if job.state != JobState.PENDING:
            return None
        return self.get_state_reason(job) or "waiting for the scheduler's next cycle"

    def get_queue_position(self, job: Job) -> int | None:
        return job.queue_position if job.state == JobState.PENDING else None

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_eta(self, job: Job) -> str | None:
        if job.state != JobState.PENDING or job.eta is None:
            return None
        return serializers.DateTimeField().to_representation(job.eta)

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField(), allow_null=True))
    def get_eta_band(self, job: Job) -> list[str] | None:
        if job.state != JobState.PENDING or job.eta is None:
            return None
        calibration = self.context.get("eta_calibration")
        if calibration is None:  # read once per response, not once per job
            calibration = self.context["eta_calibration"] = current_calibration()
        band = band_for(job.eta, timezone.now(), calibration)
        if band is None:
            return None
        return [serializers.DateTimeField().to_representation(t) for t in band]

    def get_command(self, job: Job) -> str | None:
        return job.command if can_see_command(self._user(), job) else None

    def get_env(self, job: Job) -> dict[str, str] | None:
        return job.env if can_manage_job(self._user(), job) else None

    def get_workdir(self, job: Job) -> str | None:
        return job.workdir if can_see_command(self._user(), job) else None

    def get_can_manage(self, job: Job) -> bool:
        return can_manage_job(self._user(), job)

    @extend_schema_field(serializers.BooleanField(allow_null=True))
    def get_resumed(self, job: Job) -> bool | None:
        if not job.attempt or job.state in QUEUED_STATES:
            return None
        known = self.context.get("resumed")  # a list reads every job's in one query
        if known is not None and job.pk in known:
            return known[job.pk]
        return attempt_resumed(job_id=job.pk, attempt=job.attempt)

    @extend_schema_field(JobMemberSerializer(many=True))
    def get_members(self, job: Job) -> list[dict[str, Any]]:
        if job.state in QUEUED_STATES:
            return []
        rows = job_members(job=job)
        return list(JobMemberSerializer(rows, many=True).data)


@extend_schema_field(OpenApiTypes.BOOL)
class FlagFilter(django_filters.CharFilter):
    """true/false (or 1/0, yes/no, on/off); the method refuses anything else."""


class JobFilter(django_filters.FilterSet):
    """Filters of the job list; a value that is not valid for its filter is a 400."""

    state = django_filters.MultipleChoiceFilter(choices=JobState.choices)
    team = django_filters.CharFilter(field_name="team__slug")
    owner = django_filters.CharFilter(field_name="owner__username")
    mine = FlagFilter(method="filter_mine", help_text="Only your own jobs.")
    array = django_filters.NumberFilter(
        field_name="array_id", help_text="Only the tasks of this job array."
    )

    class Meta:
        model = Job
        fields = ["state", "team", "owner", "mine", "array"]

    def filter_mine(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        word = value.strip().lower()
        if word not in TRUE_WORDS | FALSE_WORDS:
            raise ValidationError({"mine": [f"Give true or false; got {value!r}."]})
        return queryset.filter(owner=self.request.user) if word in TRUE_WORDS else queryset


LIST_PARAMS = ("state", "team", "owner", "mine", "array", "ordering", "page", "page_size")


@extend_schema_field({"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string"}]})
class ArraySpecField(serializers.Field):
    """A job array's indices: a count N (0..N-1) or "0-99", "0-99:4", "1,3,5-7"; the
    service checks the spec itself (fleet.services.job_arrays.array_indices)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, bool) or not isinstance(data, int | str):
            raise ValidationError(
                'Give a count such as 16, or indices as a string such as "0-99", "0-99:4" '
                'or "1,3,5-7".'
            )
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class ArraySubmittedSerializer(serializers.Serializer):
    array_id = serializers.IntegerField()
    name = serializers.CharField()
    array = serializers.CharField(help_text="The indices as submitted.")
    task_count = serializers.IntegerField()
    job_ids = serializers.ListField(
        child=serializers.IntegerField(), help_text="The tasks' job ids, in index order."
    )
    indices = serializers.ListField(
        child=serializers.IntegerField(), help_text="The tasks' indices, ascending."
    )

    class Meta:
        ref_name = "ArraySubmitted"


def array_submitted(job_array: JobArray, tasks: list[Job]) -> dict[str, Any]:
    """What a submit of an array answers (ArraySubmittedSerializer)."""
    return {
        "array_id": job_array.pk,
        "name": job_array.name,
        "array": job_array.spec,
        "task_count": job_array.task_count,
        "job_ids": [t.pk for t in tasks],
        "indices": [t.array_index for t in tasks],
    }


class JobRequestInput(StrictSerializer):
    class Meta:
        ref_name = "JobRequest"

    name = StrictCharField(max_length=200)
    command = StrictCharField(trim_whitespace=False)
    team = StrictCharField(
        required=False, max_length=50, help_text="Team slug; default: your default team."
    )
    env = serializers.DictField(
        child=StrictCharField(allow_blank=True, trim_whitespace=False),
        required=False,
        help_text="Environment variables: names to string values.",
    )
    workdir = StrictCharField(required=False, allow_blank=True, max_length=1000)
    gpus = serializers.IntegerField(required=False, min_value=0, max_value=1024)
    gpu_memory_mb = serializers.IntegerField(required=False, min_value=1, max_value=INT_MAX)
    gpu_compute_percent = serializers.IntegerField(required=False, min_value=1, max_value=100)
    gpu_model = StrictCharField(required=False, allow_blank=True, max_length=100)
    min_gpu_memory_mb = serializers.IntegerField(required=False, min_value=1, max_value=INT_MAX)
    time_limit = serializers.IntegerField(
        required=False, min_value=1, max_value=INT_MAX, help_text="Seconds."
    )
    priority = serializers.IntegerField(
        required=False, min_value=PRIORITY_MIN, max_value=PRIORITY_MAX
    )
    qos = serializers.ChoiceField(choices=Qos.choices, required=False)
    preemptible = serializers.BooleanField(required=False)
    max_requeues = serializers.IntegerField(required=False, min_value=0, max_value=100)
    gpus_per_node = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=1024,
        help_text="Spread the job over nodes with this many GPUs on each; 0 or absent: "
        "every GPU on one node.",
    )
    nodes = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=1024,
        help_text="Nodes to spread over (with gpus_per_node; instead of gpus).",
    )
    cpus = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=job_services.MAX_CPUS,
        help_text="Host CPU cores on each node; default: the team's cores per GPU.",
    )
    memory_mb = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=job_services.MAX_MEMORY_MB,
        help_text="Host memory (MB) on each node; default: the team's memory per GPU.",
    )
    same_group = serializers.BooleanField(
        required=False, help_text="Put every node of the job in one topology group."
    )


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
        data = JobOutputSerializer(job, context={"request": request}).data
        return Response(data, status=status.HTTP_201_CREATED)


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
