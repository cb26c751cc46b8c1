from __future__ import annotations

from typing import Any

import pytest
from django.test import Client


@pytest.fixture(autouse=True)
def _no_shared_fragments(settings: Any) -> None:
    # Fragments shared between viewers live in Redis; tests render every request afresh.
    settings.FLEET_WEB_LIVE_CACHE_SECONDS = 0


def login(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def owner_web(owner: Any) -> Client:
    return login(owner)


@pytest.fixture
def outsider_web(outsider: Any) -> Client:
    return login(outsider)


@pytest.fixture
def stranger_web(stranger: Any) -> Client:
    return login(stranger)


@pytest.fixture
def staff_web(staff: Any) -> Client:
    return login(staff)


@pytest.fixture
def team_admin_web(team_admin: Any) -> Client:
    return login(team_admin)
