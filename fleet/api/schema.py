"""The OpenAPI schema documents each operation's error responses, not only its success.

Every API error has one shape (fleet/api/errors.py, fleet/middleware.py); this AutoSchema
adds the error statuses an operation can answer with, each with that shape, so clients and
the schema fuzzer know them:

- 400 where the operation reads a body or query parameters (validation, unknown fields),
- 401 and 403 everywhere (no or a bad token; not in a team, not staff, CSRF),
- 404 where the path names an object (or a page past the last),
- 409 for an action on an object (cancel a finished job, drain a down node),
- 413 and 415 where there is a body (too large; not JSON),
- 429 where the view is throttled.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular import openapi
from rest_framework import serializers

from fleet.api.serializers import StrictCharField, StrictSerializer

BODY_METHODS = {"POST", "PUT", "PATCH"}


class ErrorSerializer(serializers.Serializer):
    class Meta:
        ref_name = "Error"

    message = serializers.CharField(help_text="What went wrong, in a sentence a person can act on.")
    extra = serializers.DictField(
        help_text='Details: "fields" maps each bad field or parameter to its errors.'
    )


ERROR_DESCRIPTIONS = {
    "400": "Invalid input: a field, parameter or the body is wrong or unknown.",
    "401": "No valid credentials: send 'Authorization: Token <key>' or log in.",
    "403": "Not allowed for this user.",
    "404": "No such object.",
    "409": "The object's current state does not allow this.",
    "413": "The request body is too large.",
    "415": "The request body is not in a supported media type (send JSON).",
    "429": "Too many requests; retry after the time in the Retry-After header.",
}


class AutoSchema(openapi.AutoSchema):
    def _error_codes(self, responses: dict[str, Any]) -> list[str]:
        method = self.method.upper()
        has_body = method in BODY_METHODS
        parameters = self._get_parameters()
        has_query = any(p.get("in") == "query" for p in parameters)
        has_path_object = any(p.get("in") == "path" for p in parameters)
        codes = ["401", "403"]
        if has_body or has_query:
            codes.append("400")
        if has_path_object or any(p.get("name") == "page" for p in parameters):
            codes.append("404")
            if method == "POST":
                codes.append("409")
        if has_body:
            codes += ["413", "415"]
        if getattr(self.view, "throttle_classes", None) and method in BODY_METHODS:
            codes.append("429")
        return [code for code in codes if code not in responses]

    def _map_serializer(
        self, serializer: Any, direction: Any, bypass_extensions: bool = False
    ) -> Any:
        schema = super()._map_serializer(serializer, direction, bypass_extensions)
        if isinstance(serializer, StrictSerializer):
            schema["additionalProperties"] = False  # an unknown field is a 400
        return schema

    def _get_parameters(self) -> Any:
        parameters = super()._get_parameters()
        for parameter in parameters:
            schema = parameter.get("schema", {})
            if schema.get("type") == "string" and not ({"enum", "format"} & set(schema)):
                schema.setdefault("pattern", "^[^\\x00]*$")  # Django refuses NUL characters
        return parameters

    def _map_serializer_field(
        self, field: Any, direction: Any, bypass_extensions: bool = False
    ) -> Any:
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if direction == "request" and type(field) in (serializers.CharField, StrictCharField):
            # What DRF refuses in a string, stated: empty (unless allowed), NUL characters.
            if "oneOf" in schema:  # allow_blank: a string, or the empty one (exactly one holds)
                schema["oneOf"][0].setdefault("pattern", "^[^\\x00]+$")
            else:
                schema.setdefault("minLength", 1)
                schema.setdefault("pattern", "^[^\\x00]*$")
        return schema

    def _get_response_bodies(self, direction: Any = "response") -> Any:
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code in self._error_codes(responses):
            response = self._get_response_for_code(ErrorSerializer, code, direction=direction)
            response["description"] = ERROR_DESCRIPTIONS[code]
            responses[code] = response
        return dict(sorted(responses.items()))
