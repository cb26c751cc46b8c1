"""Who may open which page: anonymous visitors go to the login page, users in no team are
refused, members see the fleet, staff alone see the scheduler and drain nodes."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

MEMBER_PAGES = [
    "/fleet/",
    "/fleet/?partial=1",
    "/queue/",
    "/queue/?partial=1",
    "/submit/",
    "/nodes/sim-a/",
    "/nodes/sim-a/telemetry.json",
    "/usage/",
    "/usage.json",
    "/token/",
]


@pytest.fixture
def job(owner: Any, team: Any, fleet_nodes: Any) -> Any:
    return JobFactory(owner=owner, team=team, name="resnet")


def _pages(job: Any) -> list[str]:
    return [*MEMBER_PAGES, f"/jobs/{job.pk}/", f"/jobs/{job.pk}/telemetry.json", "/scheduler/"]


def test_anonymous_visitor_is_sent_to_login(job: Any) -> None:
    client = Client()
    for url in _pages(job):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url


def test_root_leads_to_the_fleet(owner_web: Client, fleet_nodes: Any) -> None:
    response = owner_web.get("/", follow=True)
    assert response.redirect_chain[-1][0] == "/fleet/"
    assert b"sim-a" in response.content


def test_user_in_no_team_is_refused_every_page(stranger_web: Client, job: Any) -> None:
    for url in _pages(job):
        response = stranger_web.get(url)
        assert response.status_code == 403, url
    assert b"not a member of any team" in stranger_web.get("/fleet/").content


def test_member_opens_every_page_but_the_scheduler(owner_web: Client, job: Any) -> None:
    for url in _pages(job):
        response = owner_web.get(url)
        expected = 403 if url == "/scheduler/" else 200
        assert response.status_code == expected, url


def test_staff_opens_the_scheduler_page(staff_web: Client) -> None:
    response = staff_web.get("/scheduler/")
    assert response.status_code == 200
    assert b"Django admin" in response.content


def test_stranger_cannot_act_on_a_job(stranger_web: Client, job: Any) -> None:
    response = stranger_web.post(f"/jobs/{job.pk}/cancel/")
    assert response.status_code == 403
    job.refresh_from_db()
    assert job.state == "pending"


def test_only_staff_drain_nodes(owner_web: Client, staff_web: Client, fleet_nodes: Any) -> None:
    node = fleet_nodes[0]
    assert owner_web.post(f"/nodes/{node.name}/drain/").status_code == 403
    node.refresh_from_db()
    assert node.state == "up"
    response = staff_web.post(f"/nodes/{node.name}/drain/", {"reason": "bios update"})
    assert response.status_code == 302
    node.refresh_from_db()
    assert (node.state, node.state_reason) == ("draining", "bios update")
    assert b"Resume" in staff_web.get(f"/nodes/{node.name}/").content
    staff_web.post(f"/nodes/{node.name}/resume/")
    node.refresh_from_db()
    assert node.state == "up"


def test_drain_buttons_hidden_from_members(owner_web: Client, fleet_nodes: Any) -> None:
    assert b">Drain<" not in owner_web.get("/nodes/sim-a/").content


def test_unknown_node_and_job_are_404(owner_web: Client, db: Any) -> None:
    assert owner_web.get("/nodes/nope/").status_code == 404
    assert owner_web.get("/jobs/999999/").status_code == 404


def test_another_team_sees_no_private_path_in_reasons_on_the_pages(
    owner: Any, team: Any, fleet_nodes: Any, owner_web: Client, outsider_web: Client
) -> None:
    from fleet.models import JobEvent

    secret = "/home/owner/secret-project"
    reason = f"cannot start job: cannot enter the working directory {secret}: Permission denied"
    job = JobFactory(owner=owner, team=team, workdir=secret, state="pending", state_reason=reason)
    JobFactory(owner=owner, team=team, workdir=secret, state="held", state_reason=reason)
    JobEvent.objects.create(
        job=job, from_state="assigned", to_state="pending", attempt=1, reason=reason,
        actor_kind="node", actor="sim-a",
    )  # fmt: skip
    for url in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/?partial=1", "/queue/?partial=1"):
        page = outsider_web.get(url).content.decode()
        assert secret not in page and "[hidden]" in page, url
    assert secret in owner_web.get(f"/jobs/{job.pk}/?partial=1").content.decode()
