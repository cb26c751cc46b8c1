"""What a job submit takes (JobRequestInput, the `array` spec) and what an array submit
answers; shared by /api/v1/jobs/, the bulk submit and the estimate."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
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


# The lean check of a submit body. The serializer above stays the definition of what a submit
# takes; a body made only of fields of the plain types it expects (an int within its bounds,
# a bool, a string within its length, a dict of strings) is checked here in plain Python,
# field by field with the serializer's own bounds, for a fraction of the serializer's cost.
# Anything else (a number sent as a string, a null, an unknown field, an error of any kind)
# returns None, and the caller runs the serializer, which answers it exactly as before.

Check = Callable[[Any], bool]


def _plain_text(value: Any) -> bool:
    # What DRF's CharField validators refuse: NUL characters and lone surrogates.
    return "\x00" not in value and (value.isascii() or not _SURROGATES.search(value))


_SURROGATES = re.compile("[\ud800-\udfff]")


def _text_check(field: serializers.CharField) -> Check | None:
    if not isinstance(field, StrictCharField) or field.min_length is not None:
        return None
    longest, blank_ok = field.max_length, field.allow_blank

    def check(value: Any) -> bool:
        return (
            type(value) is str
            and (blank_ok or value != "")
            and (longest is None or len(value) <= longest)
            and _plain_text(value)
        )

    return check


def _int_check(field: serializers.IntegerField) -> Check:
    low, high = field.min_value, field.max_value

    def check(value: Any) -> bool:
        return (
            type(value) is int and (low is None or value >= low) and (high is None or value <= high)
        )

    return check


def _own_validators(field: serializers.Field) -> int:
    """How many validators DRF gives the field from its own arguments (the bounds, and for
    text the NUL and surrogate checks): a field with more has validators of its own, which
    the lean path leaves to the serializer."""
    if isinstance(field, serializers.IntegerField):
        return (field.min_value is not None) + (field.max_value is not None)
    if isinstance(field, serializers.CharField):
        return (field.max_length is not None) + (field.min_length is not None) + 2
    return 0


def _field_check(field: serializers.Field) -> Check | None:
    """How the lean path checks one field's value, or None where it leaves the field to the
    serializer. Null values never pass."""
    if field.allow_null or len(field.validators) != _own_validators(field):
        return None
    if isinstance(field, serializers.BooleanField):
        return lambda value: type(value) is bool
    if isinstance(field, serializers.IntegerField):
        return _int_check(field)
    if isinstance(field, serializers.ChoiceField):
        if field.allow_blank:
            return None
        choices = frozenset(k for k in field.choices if isinstance(k, str))
        return lambda value: type(value) is str and value in choices
    if isinstance(field, serializers.CharField):
        return _text_check(field)
    if isinstance(field, serializers.DictField):
        child = _text_check(field.child) if isinstance(field.child, serializers.CharField) else None
        if child is None or not field.allow_empty or field.child.allow_null:
            return None
        if len(field.child.validators) != _own_validators(field.child):
            return None
        return lambda value: type(value) is dict and all(child(v) for v in value.values())
    return None


@cache
def _checks(
    serializer_class: type[serializers.Serializer],
) -> tuple[dict[str, Check | None], frozenset[str]]:
    declared = serializer_class._declared_fields  # type: ignore[attr-defined]
    checks = {name: _field_check(field) for name, field in declared.items()}
    required = frozenset(name for name, field in declared.items() if field.required)
    return checks, required


def lean_values(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any] | None:
    """The body's values as `serializer_class(data=data).validated_data` would give them, when
    the lean check can vouch for every field; else None (run the serializer)."""
    if type(data) is not dict:
        return None
    checks, required = _checks(serializer_class)
    for name in required:
        if name not in data:
            return None
    for name, value in data.items():
        check = checks.get(name)
        if check is None or not check(value):
            return None
    return dict(data)
