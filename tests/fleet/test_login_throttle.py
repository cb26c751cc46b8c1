"""Brute-force protection: the login forms lock a user name and address out after repeated
wrong passwords, and token creation is rate-limited."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

ATTACKER = "203.0.113.7"
ELSEWHERE = "198.51.100.20"


def _login(url: str, username: str, password: str, address: str) -> Any:
    client = Client()
    response = client.post(
        url, {"username": username, "password": password, "next": "/"}, REMOTE_ADDR=address
    )
    response.logged_in = "_auth_user_id" in client.session
    return response


def _hammer(url: str, username: str) -> None:
    for _ in range(20):
        response = _login(url, username, "wrong-password", ATTACKER)
        assert not response.logged_in


@pytest.mark.parametrize("url", ["/login/", "/admin/login/"])
def test_twenty_wrong_passwords_lock_that_user_out_from_that_address(url: str) -> None:
    UserFactory(username="victim", is_staff=True)
    _hammer(url, "victim")
    response = _login(url, "victim", "pw-for-tests", ATTACKER)
    assert not response.logged_in
    assert response.status_code == 429
    page = response.content.decode()
    assert "Too many failed logins" in page and "Try again in 15 minutes" in page


@pytest.mark.parametrize("url", ["/login/", "/admin/login/"])
def test_a_lockout_leaves_other_users_and_addresses_alone(url: str) -> None:
    UserFactory(username="victim", is_staff=True)
    UserFactory(username="bystander", is_staff=True)
    _hammer(url, "victim")
    assert _login(url, "bystander", "pw-for-tests", ATTACKER).logged_in
    assert _login(url, "victim", "pw-for-tests", ELSEWHERE).logged_in


def test_a_few_wrong_passwords_do_not_lock_anyone_out() -> None:
    UserFactory(username="typo")
    for _ in range(3):
        _login("/login/", "typo", "wrong-password", ATTACKER)
    assert _login("/login/", "typo", "pw-for-tests", ATTACKER).logged_in


def test_token_creation_is_rate_limited_per_user(owner: Any, teammate: Any) -> None:
    cache.clear()
    api = APIClient()
    api.force_authenticate(owner)
    statuses = [api.post("/api/v1/tokens/").status_code for _ in range(11)]
    assert statuses == [201] * 10 + [429]
    refused = api.post("/api/v1/tokens/")
    assert refused.json()["message"].startswith("Request was throttled")
    assert int(refused["Retry-After"]) > 0
    other = APIClient()
    other.force_authenticate(teammate)
    assert other.post("/api/v1/tokens/").status_code == 201
