"""The OpenAPI schema builds without warnings and documents each operation's errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

ERROR_REF = "#/components/schemas/Error"


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = Path(tmp_path_factory.mktemp("schema")) / "schema.json"
    call_command("spectacular", "--fail-on-warn", "--format", "openapi-json", "--file", str(path))
    return json.loads(path.read_text())


def _errors(schema: dict[str, Any], path: str, method: str) -> dict[str, Any]:
    responses = schema["paths"][path][method]["responses"]
    return {code: r for code, r in responses.items() if code.startswith(("4", "5"))}


def test_every_operation_documents_its_auth_errors_in_the_error_shape(
    schema: dict[str, Any],
) -> None:
    for path, operations in schema["paths"].items():
        for method in operations:
            errors = _errors(schema, path, method)
            assert {"401", "403"} <= set(errors), (method, path)
            for code, response in errors.items():
                body = response["content"]["application/json"]["schema"]
                assert body == {"$ref": ERROR_REF}, (method, path, code)
    error = schema["components"]["schemas"]["Error"]
    assert set(error["required"]) == {"message", "extra"}


@pytest.mark.parametrize(
    ("path", "method", "codes"),
    [
        ("/api/v1/jobs/", "post", {"400", "401", "403", "413", "415"}),
        ("/api/v1/jobs/", "get", {"400", "401", "403", "404"}),
        ("/api/v1/jobs/{job_id}/", "get", {"401", "403", "404"}),
        ("/api/v1/jobs/{job_id}/cancel/", "post", {"400", "401", "403", "404", "409", "413"}),
        ("/api/v1/teams/{slug}/", "patch", {"400", "401", "403", "404", "413", "415"}),
        ("/api/v1/tokens/", "post", {"401", "403", "429"}),
        ("/api/v1/me/", "get", {"401", "403"}),
    ],
)
def test_operations_document_the_errors_they_can_answer(
    schema: dict[str, Any], path: str, method: str, codes: set[str]
) -> None:
    assert codes <= set(_errors(schema, path, method))


def test_request_bodies_refuse_unknown_fields_in_the_schema(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    for name in ("JobSubmitInput", "PatchedTeamUpdateInput", "PatchedSchedulerSettingsInput"):
        assert components[name]["additionalProperties"] is False
    params = components["PatchedSchedulerSettingsInput"]["properties"]["params"]
    assert params["properties"]["genetic_population"]["maximum"] == 10000
