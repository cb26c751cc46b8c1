"""What each page shows: the fleet's tiles and totals, the queue in policy order with
reasons and ETAs, the job's timeline and buttons, and plain notes where data is missing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from fleet.models import Job, NodeState
from fleet.services.job_states import SCHEDULER, Actor, job_transition
from scheduler.cycle.queue_order import store_waits
from tests.factories import JobFactory, MembershipFactory

pytestmark = pytest.mark.django_db


def _run(job: Job, node: Any, indices: list[int]) -> Job:
    job_transition(
        job_id=job.pk, action="dispatch", actor=SCHEDULER, reason="placed",
        fields={"node": node, "gpu_indices": indices},
    )  # fmt: skip
    return job_transition(job_id=job.pk, action="start", actor=Actor.node(node.name), reason="")


def test_fleet_shows_tiles_jobs_owners_and_totals(
    owner_web: Client, owner: Any, team: Any, fleet_nodes: Any
) -> None:
    a, b = fleet_nodes
    _run(JobFactory(owner=owner, team=team, name="bert-large", gpus=2), a, [0, 1])
    b.state = NodeState.DOWN
    b.save()
    html = owner_web.get("/fleet/").content.decode()
    assert "bert-large" in html and "owner" in html
    assert html.count('class="tile ') == 6
    assert html.count("tile util-none held") == 2
    # sim-a: 2 busy, 2 free; sim-b (2 GPUs) is down.
    assert "<strong>2</strong> free" in html
    assert "<strong>2</strong> busy" in html
    assert "<strong>2</strong> down" in html
    assert "simulated" in html
    assert "No telemetry yet" in html


def test_fleet_partial_is_a_fragment_and_filters_by_state(
    owner_web: Client, fleet_nodes: Any
) -> None:
    fleet_nodes[1].state = NodeState.DRAINING
    fleet_nodes[1].save()
    response = owner_web.get("/fleet/?state=draining", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert "<html" not in html
    assert "sim-b" in html and "sim-a" not in html


def test_fleet_paginates_nodes(owner_web: Client, fleet_nodes: Any) -> None:
    html = owner_web.get("/fleet/?per_page=1").content.decode()
    assert "Page 1 of 2" in html and "sim-a" in html and "sim-b" not in html
    assert "sim-b" in owner_web.get("/fleet/?per_page=1&page=2").content.decode()


def test_queue_lists_pending_in_policy_order_with_reason_and_eta(
    owner_web: Client, owner: Any, teammate: Any, team: Any, other_team: Any
) -> None:
    eta = timezone.now() + timedelta(hours=2)
    first = JobFactory(
        owner=teammate,
        team=team,
        name="second-submitted",
        eta=eta,
    )
    mine = JobFactory(owner=owner, team=team, name="first-submitted")
    outsider = MembershipFactory(team=other_team, user__username="someone").user
    other = JobFactory(owner=outsider, team=other_team, name="other-team-job")
    # As the last cycle left them: the order, and why each waits.
    store_waits(
        [
            (first.pk, "waiting for 4 free GPUs on one node"),
            (mine.pk, "needs 1 GPU"),
            (other.pk, "needs 1 GPU"),
        ]
    )
    html = owner_web.get("/queue/").content.decode()
    assert (
        html.index("second-submitted")
        < html.index("first-submitted")
        < html.index("other-team-job")
    )
    assert "waiting for 4 free GPUs on one node" in html
    assert "hour" in html  # the ETA, "in about 2 hours"
    assert first.pk
    mine = owner_web.get("/queue/?scope=mine").content.decode()
    assert "first-submitted" in mine and "second-submitted" not in mine
    team_only = owner_web.get("/queue/?scope=team").content.decode()
    assert "second-submitted" in team_only and "other-team-job" not in team_only


def test_queue_shows_running_jobs(owner_web: Client, owner: Any, team: Any, fleet_nodes: Any):
    _run(JobFactory(owner=owner, team=team, name="on-gpus"), fleet_nodes[0], [3])
    html = owner_web.get("/queue/").content.decode()
    running = html[html.index('id="h-running"') :]
    assert "on-gpus" in running and "sim-a" in running


def test_job_page_timeline_and_buttons_for_owner(
    owner_web: Client, owner: Any, team: Any, fleet_nodes: Any
) -> None:
    job = _run(JobFactory(owner=owner, team=team, name="timeline"), fleet_nodes[0], [0])
    html = owner_web.get(f"/jobs/{job.pk}/").content.decode()
    for state in ("assigned", "running"):
        assert f'class="badge js-{state}">{state}</span>' in html
    assert ">Cancel<" in html and ">Requeue<" in html and ">Hold<" not in html
    assert "Logs are not available yet" in html or 'id="log"' in html
    partial = owner_web.get(f"/jobs/{job.pk}/?partial=1").content.decode()
    assert 'id="job-state">running<' in partial and "<html" not in partial


def test_other_team_sees_no_buttons_and_cannot_cancel(
    outsider_web: Client, owner: Any, team: Any
) -> None:
    job = JobFactory(owner=owner, team=team, name="theirs")
    html = outsider_web.get(f"/jobs/{job.pk}/").content.decode()
    assert "theirs" in html
    assert ">Cancel<" not in html and ">Hold<" not in html
    assert "echo hello" not in html  # the command is for the team only
    assert outsider_web.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.state == "pending"


def test_team_admin_may_hold_and_release(team_admin_web: Client, owner: Any, team: Any) -> None:
    job = JobFactory(owner=owner, team=team)
    assert ">Hold<" in team_admin_web.get(f"/jobs/{job.pk}/").content.decode()
    team_admin_web.post(f"/jobs/{job.pk}/hold/")
    job.refresh_from_db()
    assert job.state == "held"
    team_admin_web.post(f"/jobs/{job.pk}/release/")
    job.refresh_from_db()
    assert job.state == "pending"


def test_refused_transition_is_a_message_not_an_error(
    owner_web: Client, owner: Any, team: Any
) -> None:
    job = JobFactory(owner=owner, team=team)
    response = owner_web.post(f"/jobs/{job.pk}/release/", follow=True)
    assert response.status_code == 200
    assert "release applies only to held jobs" in response.content.decode().replace("&#x27;", "'")


def test_telemetry_json_says_plainly_when_there_is_none(
    owner_web: Client, owner: Any, team: Any, fleet_nodes: Any
) -> None:
    data = owner_web.get("/nodes/sim-a/telemetry.json?range=6h").json()
    assert data["available"] is False and "No telemetry" in data["message"]
    job = JobFactory(owner=owner, team=team)
    data = owner_web.get(f"/jobs/{job.pk}/telemetry.json").json()
    assert data["available"] is False and "once the job runs" in data["message"]


def test_every_page_names_its_icon_and_the_icon_is_served(client: Client) -> None:
    """Browsers ask for an icon on every page; without one they log a 404 each time."""
    from django.contrib.staticfiles import finders

    response = client.get("/login/")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html
    found = finders.find("favicon.svg")
    assert found and open(found).read().startswith("<svg")
