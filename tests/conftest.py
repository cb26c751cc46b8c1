"""Fixtures for people: an owner, a teammate, a team admin, a member of another team,
a stranger in no team, and staff. Each comes with an API client holding their token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.factories import GpuFactory, MembershipFactory, NodeFactory, TeamFactory, UserFactory


@pytest.fixture(autouse=True)
def control_side_heard_throughout() -> Iterator[None]:
    """The reaper does not count silence from a stretch in which it did not run (an
    outage of the control side). Tests that call it with `now`s of their choosing jump in
    time, which it would take for such a stretch: each test starts with a record of
    uninterrupted hearing (tests/fleet/test_reaper_hearing.py sets its own)."""
    from django.core.cache import cache

    from fleet.services.reaper import HEARING_KEY

    try:
        cache.set(HEARING_KEY, {"deaf_from": 0.0, "since": 0.0, "last": float("inf")}, None)
    except Exception:
        pass  # no Redis: the tests that need it say so themselves
    yield


def _client(user: Any) -> APIClient:
    from fleet.services.tokens import token_rotate

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_rotate(user=user)}")
    client.user = user
    return client


@pytest.fixture
def team(db: Any) -> Any:
    return TeamFactory(slug="vision", name="Vision", gpu_limit=16, max_time_limit=86400)


@pytest.fixture
def other_team(db: Any) -> Any:
    return TeamFactory(slug="speech", name="Speech")


@pytest.fixture
def owner(team: Any) -> Any:
    return MembershipFactory(team=team, user__username="owner").user


@pytest.fixture
def teammate(team: Any) -> Any:
    return MembershipFactory(team=team, user__username="teammate").user


@pytest.fixture
def team_admin(team: Any) -> Any:
    return MembershipFactory(team=team, role="admin", user__username="teamadmin").user


@pytest.fixture
def outsider(other_team: Any) -> Any:
    """A member of another team."""
    return MembershipFactory(team=other_team, user__username="outsider").user


@pytest.fixture
def stranger(db: Any) -> Any:
    """An authenticated user in no team."""
    return UserFactory(username="stranger")


@pytest.fixture
def staff(db: Any) -> Any:
    return UserFactory(username="staff", is_staff=True, is_superuser=True)


@pytest.fixture
def owner_api(owner: Any) -> APIClient:
    return _client(owner)


@pytest.fixture
def teammate_api(teammate: Any) -> APIClient:
    return _client(teammate)


@pytest.fixture
def team_admin_api(team_admin: Any) -> APIClient:
    return _client(team_admin)


@pytest.fixture
def outsider_api(outsider: Any) -> APIClient:
    return _client(outsider)


@pytest.fixture
def stranger_api(stranger: Any) -> APIClient:
    return _client(stranger)


@pytest.fixture
def staff_api(staff: Any) -> APIClient:
    return _client(staff)


@pytest.fixture
def anon_api() -> APIClient:
    return APIClient()


@pytest.fixture
def fleet_nodes(db: Any) -> list[Any]:
    """Two nodes: sim-a with 4 A100-80GB and sim-b with 2 V100-32GB."""
    a = NodeFactory(name="sim-a", gpu_backend="simulated")
    b = NodeFactory(name="sim-b", gpu_backend="simulated")
    for i in range(4):
        GpuFactory(node=a, index=i, model="A100-80GB", memory_mb=81920)
    for i in range(2):
        GpuFactory(node=b, index=i, model="V100-32GB", memory_mb=32768)
    return [a, b]


@pytest.fixture
def sent(monkeypatch: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """Messages the control side sends (task, queue, kwargs), recorded instead of sent."""
    from fleet.services import messaging
    from tests.messages import node_message_args

    out: list[tuple[str, str, dict[str, Any]]] = []
    monkeypatch.setattr(
        messaging,
        "_send",
        lambda task, queue, kwargs, countdown=None: out.append(
            (task, queue, node_message_args(task, queue, kwargs))
        ),
    )
    return out
