"""Property-based fuzzing of the REST API against its own OpenAPI schema (schemathesis).

Each operation is called in-process (WSGI) with cases generated from the schema, valid and
invalid, by a team member and (for what staff may change) by staff, and every response is
held to all of schemathesis' checks: no 5xx, only documented status codes and content
types, bodies that match the documented schema, invalid input refused and valid input
accepted. Generation is derandomized and keeps no example database, so a run is
repeatable and nothing carries over between CI runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from fleet.services.job_arrays import job_array_submit
from fleet.services.jobs import JobRequest
from fleet.services.tokens import token_rotate
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

EXAMPLES = 20  # per operation, generation mode and kind of path parameters
MIN_CASES = 1000
# Rotating the token mid-run would log the fuzzer out; its own tests cover it.
SKIPPED = {("POST", "/api/v1/tokens/")}
STAFF_METHODS = {"POST", "PATCH", "PUT", "DELETE"}
# Operations whose services apply rules a schema cannot state: the submitter's teams and
# their quotas, what the fleet's nodes can hold, a node's own GPU indices, a team's limits
# taken together. A schema-valid request may be refused there, so positive_data_acceptance
# is replaced by a check of its own: the refusal is a 400 in the error shape with a message
# and the fields or parameters to fix, each one the operation takes.
BUSINESS_RULES = {
    ("POST", "/api/v1/jobs/"),
    ("POST", "/api/v1/jobs/estimate/"),
    ("POST", "/api/v1/jobs/bulk/"),
    ("PATCH", "/api/v1/teams/{slug}/"),
    ("GET", "/api/v1/nodes/{name}/telemetry/"),
    # A period that starts before it ends, and spans at most a year.
    ("GET", "/api/v1/usage/"),
    # A webhook URL fleet can POST to (http or https, with a host); email only with an
    # address on the account.
    ("PUT", "/api/v1/me/notifications/"),
}


@pytest.fixture
def in_process_requests() -> Iterator[None]:
    """Requests run inside the test's transaction: Django must not close the connection at
    the start and end of each one (its test client does the same)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _schema() -> Any:
    spec = SchemaGenerator().get_schema(request=None, public=True)
    raw = json.loads(OpenApiJsonRenderer().render(spec, renderer_context={}))
    schema = schemathesis.openapi.from_dict(raw)
    schema.app = get_wsgi_application()
    return schema


def _refusal_names_a_field(operation: Any, response: Any) -> None:
    body = response.json()
    fields = set(body.get("extra", {}).get("fields") or {})
    known = {p.name for p in operation.query}
    spec = operation.schema.raw_schema
    request = spec["paths"][operation.path][operation.method.lower()].get("requestBody", {})
    ref = request.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref", "")
    component = spec["components"]["schemas"].get(ref.rsplit("/", 1)[-1], {})
    known |= set(component.get("properties", {}))
    assert body.get("message") and fields and fields <= known, (
        f"a schema-valid request was refused without naming what to fix: {body}"
    )


def _run(operation: Any, headers: dict[str, str], path: dict[str, Any] | None) -> list[str]:
    """Fuzz one operation in both generation modes; the failures it found, as text."""
    failures: list[str] = []
    cases = 0

    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        strategy = operation.as_strategy(generation_mode=mode, path_parameters=path)

        @settings(
            max_examples=EXAMPLES,
            database=None,
            derandomize=True,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def fuzz(case: Any) -> None:
            nonlocal cases
            cases += 1
            response = case.call(headers=headers)
            ruled = (operation.method.upper(), operation.path) in BUSINESS_RULES
            try:
                case.validate_response(
                    response,
                    headers=headers,
                    excluded_checks=[positive_data_acceptance] if ruled else None,
                )
                # fuzz() runs within this iteration of the loop, so `mode` is current.
                positive = mode is GenerationMode.POSITIVE  # noqa: B023
                if ruled and positive and response.status_code == 400:
                    _refusal_names_a_field(operation, response)
            except BaseExceptionGroup as group:  # schemathesis' FailureGroup: this case's
                seen = f"answered {response.status_code}: {response.text[:300]}"
                failures.extend(f"{operation.label}: {f}\n{seen}" for f in group.exceptions)
            except AssertionError as failure:
                failures.append(f"{operation.label}: {failure}")

        try:
            fuzz()
        except Unsatisfiable:
            # Nothing to make invalid: no parameters, or only the fixed path.
            assert mode is GenerationMode.NEGATIVE, operation.label
    _run.cases += cases  # type: ignore[attr-defined]
    return failures


def test_the_api_holds_to_its_schema_under_fuzzing(
    in_process_requests: None, owner: Any, staff: Any, fleet_nodes: Any, team: Any
) -> None:
    member_headers = {"Authorization": f"Token {token_rotate(user=owner)}"}
    staff_headers = {"Authorization": f"Token {token_rotate(user=staff)}"}
    job = JobFactory(owner=owner, team=team, workdir="/home/owner/project")
    real = {"job_id": job.pk, "name": fleet_nodes[0].name, "slug": team.slug}
    real["run_id"] = "0123456789abcdef"  # an advisor run id (none exists: 404 or 403)
    job_array, _ = job_array_submit(
        user=owner, request=JobRequest(name="sweep", command="true"), array=2
    )
    real["array_id"] = job_array.pk

    _run.cases = 0  # type: ignore[attr-defined]
    failures: list[str] = []
    operations = [result.ok() for result in _schema().get_all_operations()]
    for operation in operations:
        if (operation.method.upper(), operation.path) in SKIPPED:
            continue
        names = [p.name for p in operation.path_parameters]
        kinds: list[dict[str, Any] | None] = [None]
        if names:
            kinds.append({name: real[name] for name in names})
        callers = [member_headers]
        if operation.method.upper() in STAFF_METHODS:
            callers.append(staff_headers)
        for headers in callers:
            for path in kinds:
                failures += _run(operation, headers, path)

    print(f"schema fuzzing: {_run.cases} cases over {len(operations)} operations")  # type: ignore[attr-defined]
    assert len(operations) >= 20
    assert _run.cases >= MIN_CASES, _run.cases  # type: ignore[attr-defined]
    distinct = {f.split("\n")[0]: f for f in failures}  # one example of each kind
    shown = "\n\n".join(f[:2000] for f in distinct.values())
    assert not failures, f"{len(failures)} failures, {len(distinct)} kinds:\n\n{shown}"
