"""Input serializers that refuse what they do not know, and bounds the database holds.

A field name with a typo, a query parameter the endpoint does not read, a number a column
cannot store: each is a 400 that names it, never a silent no-op or a 500.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})

# Column ranges: PositiveIntegerField, PositiveSmallIntegerField.
INT_MAX = 2**31 - 1
SMALL_INT_MAX = 2**15 - 1


def _refuse_unknown(data: Any, known: Iterable[str], what: str) -> None:
    if not isinstance(data, Mapping):
        return
    known = sorted(known)
    unknown = sorted(str(key) for key in data if key not in known)
    if unknown:
        hint = f"known: {', '.join(known)}" if known else f"this endpoint takes no {what}s"
        raise ValidationError({name: [f"Unknown {what}; {hint}."] for name in unknown})


class StrictSerializer(serializers.Serializer):
    # A request body serializer: a field it does not declare is an error. (A comment, not a
    # docstring: the schema would show it as every input's description.)

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise ValidationError(
                {"non_field_errors": ["Send a JSON object with the fields named in the schema."]}
            )
        _refuse_unknown(data, self.fields, "field")
        return super().to_internal_value(data)


class QuerySerializer(serializers.Serializer):
    # Query parameters: unknown ones and repeated ones are errors.

    def to_internal_value(self, data: Any) -> Any:
        _refuse_unknown(data, self.fields, "query parameter")
        if hasattr(data, "getlist"):
            repeated = sorted(k for k in data if len(data.getlist(k)) > 1)
            if repeated:
                raise ValidationError({k: ["Give this parameter once."] for k in repeated})
            # A plain dict: DRF would read an empty value in a QueryDict as "not given", so
            # ?until= would mean now; here it is a value, and a bad one.
            data = {key: data.get(key) for key in data}
        return super().to_internal_value(data)


def check_query_params(
    request: Request, known: Iterable[str], *, repeatable: Iterable[str] = ()
) -> None:
    """Refuse query parameters the endpoint does not read (a typo filters nothing), and a
    parameter given twice that takes one value."""
    params = request.query_params
    _refuse_unknown(params, known, "query parameter")
    repeated = sorted(k for k in params if k not in repeatable and len(params.getlist(k)) > 1)
    if repeated:
        raise ValidationError({k: ["Give this parameter once."] for k in repeated})


def check_no_body(request: Request) -> None:
    """Refuse a body on an endpoint that takes none."""
    data = request.data
    if isinstance(data, Mapping):
        _refuse_unknown(data, (), "field")
    elif data:
        raise ValidationError({"non_field_errors": ["This endpoint takes no request body."]})


class StrictCharField(serializers.CharField):
    """A string, and only a string: 5 is refused rather than stored as "5". Kept as sent
    (no trimming), so the schema's length limits are the ones applied; services refuse a
    name that is only blanks."""

    default_error_messages = {"invalid": "Must be a string."}

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        # The limit holds for what was sent, as the schema says, not for what is left after
        # trimming whitespace.
        if self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


class QueryBooleanField(serializers.BooleanField):
    """A query flag: 1/0, true/false, yes/no, on/off; anything else is an error."""

    default_error_messages = {"invalid": "Give true or false."}

    def to_internal_value(self, data: Any) -> bool:
        word = str(data).strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        self.fail("invalid")
        raise AssertionError  # fail() raises
