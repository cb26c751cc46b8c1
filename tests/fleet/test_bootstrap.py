from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from fleet.models import Membership

pytestmark = pytest.mark.django_db


def _add_user(*args: str) -> str:
    out, err = StringIO(), StringIO()
    call_command("add_user", *args, stdout=out, stderr=err)
    return out.getvalue().strip().splitlines()[-1]


def test_add_user_prints_a_working_token_last() -> None:
    key = _add_user("alice", "--team", "vision", "--team-admin", "--password", "a-long-password")
    membership = Membership.objects.get(user__username="alice")
    assert (membership.team.slug, membership.role, membership.is_default) == (
        "vision",
        "admin",
        True,
    )
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/v1/me/").json()["default_team"] == "vision"


def test_script_with_a_token_submits_lists_and_cancels_and_others_cannot(fleet_nodes: Any) -> None:
    alice, bob = APIClient(), APIClient()
    alice.credentials(HTTP_AUTHORIZATION=f"Token {_add_user('alice', '--team', 'vision')}")
    bob.credentials(HTTP_AUTHORIZATION=f"Token {_add_user('bob', '--team', 'speech')}")
    job = alice.post("/api/v1/jobs/", {"name": "t", "command": "sleep 1"}, format="json").json()
    assert [j["id"] for j in alice.get("/api/v1/jobs/?mine=1").json()["results"]] == [job["id"]]
    assert bob.post(f"/api/v1/jobs/{job['id']}/cancel/").status_code == 403
    assert alice.post(f"/api/v1/jobs/{job['id']}/cancel/").json()["state"] == "cancelled"


def test_add_user_staff_and_rerun_rotates_token() -> None:
    first = _add_user("root", "--staff")
    second = _add_user("root", "--staff")
    assert first != second
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {first}")
    assert api.get("/api/v1/me/").status_code == 401
    api.credentials(HTTP_AUTHORIZATION=f"Token {second}")
    assert api.get("/api/v1/me/").json()["is_staff"] is True
