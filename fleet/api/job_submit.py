"""What a job submit takes (JobRequestInput, the `array` spec) and what an array submit
answers; shared by /api/v1/jobs/, the bulk submit and the estimate."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import ValidationError

from fleet.api.serializers import INT_MAX, StrictCharField, StrictSerializer
from fleet.models import Job
from fleet.models.jobs import PRIORITY_MAX, PRIORITY_MIN, JobArray, Qos
from fleet.services import jobs as job_services


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
