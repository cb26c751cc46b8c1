"""Every endpoint refuses the anonymous caller and the stranger in no team."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.django_db

ENDPOINTS = [
    ("get", "/api/v1/jobs/"),
    ("post", "/api/v1/jobs/"),
    ("get", "/api/v1/jobs/{job}/"),
    ("post", "/api/v1/jobs/{job}/cancel/"),
    ("post", "/api/v1/jobs/{job}/hold/"),
    ("post", "/api/v1/jobs/{job}/release/"),
    ("post", "/api/v1/jobs/{job}/requeue/"),
    ("get", "/api/v1/jobs/{job}/events/"),
    ("get", "/api/v1/nodes/"),
    ("get", "/api/v1/nodes/sim-a/"),
    ("post", "/api/v1/nodes/sim-a/drain/"),
    ("post", "/api/v1/nodes/sim-a/resume/"),
    ("get", "/api/v1/teams/"),
    ("get", "/api/v1/teams/vision/"),
    ("patch", "/api/v1/teams/vision/"),
    ("post", "/api/v1/tokens/"),
    ("get", "/api/v1/schema/"),
]


@pytest.fixture
def job_id(owner_api: Any, fleet_nodes: Any) -> int:
    return owner_api.post("/api/v1/jobs/", {"name": "a", "command": "true"}, format="json").json()[
        "id"
    ]


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
def test_stranger_is_refused(stranger_api: Any, job_id: int, method: str, url: str) -> None:
    response = getattr(stranger_api, method)(url.format(job=job_id), {}, format="json")
    assert response.status_code == 403
    expected = "Only staff" if url.endswith(("drain/", "resume/")) else "not a member of any team"
    # The schema endpoint renders its errors as OpenAPI YAML; the sentence is the same.
    assert expected in response.content.decode()


@pytest.mark.parametrize(("method", "url"), ENDPOINTS + [("get", "/api/v1/me/")])
def test_anonymous_is_refused(anon_api: Any, job_id: int, method: str, url: str) -> None:
    response = getattr(anon_api, method)(url.format(job=job_id), {}, format="json")
    assert response.status_code in (401, 403)
    assert "credentials were not provided" in response.content.decode()


def test_anonymous_docs_visitor_is_sent_to_login(anon_api: Any) -> None:
    response = anon_api.get("/api/v1/docs/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_docs_page_refuses_a_logged_in_stranger(client: Any, stranger: Any) -> None:
    client.force_login(stranger)
    assert client.get("/api/v1/docs/").status_code == 403


def test_stranger_may_read_me(stranger_api: Any) -> None:
    body = stranger_api.get("/api/v1/me/").json()
    assert body == {"username": "stranger", "is_staff": False, "teams": [], "default_team": None}


def test_a_bad_token_is_refused_with_a_hint(anon_api: Any, owner: Any) -> None:
    anon_api.credentials(HTTP_AUTHORIZATION="Token not-a-real-key")
    response = anon_api.get("/api/v1/me/")
    assert response.status_code == 401
    assert "Invalid token" in response.json()["message"]


def test_rotating_a_token_revokes_the_old_one(owner_api: Any, anon_api: Any) -> None:
    new_key = owner_api.post("/api/v1/tokens/").json()["token"]
    assert owner_api.get("/api/v1/me/").status_code == 401  # the client still holds the old key
    anon_api.credentials(HTTP_AUTHORIZATION=f"Token {new_key}")
    assert anon_api.get("/api/v1/me/").json()["username"] == "owner"


def test_session_login_works_for_the_browser(owner: Any, client: Any) -> None:
    assert client.login(username="owner", password="pw-for-tests")
    assert client.get("/api/v1/me/").json()["teams"][0]["slug"] == "vision"


def test_healthz_needs_no_login_and_reports_both_services(client: Any) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "redis": "ok"}


def test_healthz_says_when_redis_is_unreachable(client: Any, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert (
        response.json()["status"] == "unhealthy" and "ConnectionError" in response.json()["redis"]
    )


def test_schema_and_docs_are_served_without_a_cdn(owner_api: Any, owner: Any, client: Any) -> None:
    schema = owner_api.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert "/api/v1/jobs/{job_id}/cancel/" in schema.json()["paths"]
    client.force_login(owner)
    docs = client.get("/api/v1/docs/")
    html = docs.content.decode()
    assert docs.status_code == 200
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html
    assert "cdn." not in html and "unpkg" not in html
