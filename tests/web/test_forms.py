"""The submit form, the token page and the scheduler settings form."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from django.test import Client

from fleet.models import ApiToken, Job

pytestmark = pytest.mark.django_db

VALID = {
    "name": "resnet50",
    "command": "python train.py",
    "team": "vision",
    "gpus": "2",
    "priority": "5",
    "qos": "normal",
    "max_requeues": "3",
    "env": "SEED=1\nLR=0.1",
    "time_limit": "3600",
}


def test_submit_form_has_every_field_labelled_with_help(owner_web: Client) -> None:
    html = owner_web.get("/submit/").content.decode()
    for name in ("name", "command", "team", "gpus", "gpu_memory_mb", "gpu_compute_percent",
                 "gpu_model", "min_gpu_memory_mb", "time_limit", "priority", "qos",
                 "preemptible", "max_requeues", "env", "workdir"):  # fmt: skip
        assert f'for="id_{name}"' in html, name
        assert f'id="id_{name}_helptext"' in html, name
    assert "Start-time estimates are not available yet" in html or "data-estimate-url" in html


def test_submit_creates_the_job_and_opens_its_page(
    owner_web: Client, owner: Any, fleet_nodes: Any
) -> None:
    response = owner_web.post("/submit/", VALID)
    job = Job.objects.get(name="resnet50")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert (job.owner, job.gpus, job.priority, job.time_limit) == (owner, 2, 5, 3600)
    assert job.env == {"SEED": "1", "LR": "0.1"}


def test_service_field_errors_show_next_to_the_field(owner_web: Client, fleet_nodes: Any) -> None:
    html = owner_web.post("/submit/", {**VALID, "gpus": "6"}).content.decode()
    assert Job.objects.count() == 0
    assert "needs 6 GPUs on one node; the largest node has 4" in html
    field = html[
        html.index('class="field field-gpus') : html.index('class="field field-gpu_memory_mb')
    ]
    assert "has-error" in field and "largest node has 4" in field


def test_bad_env_line_is_an_inline_error(owner_web: Client, fleet_nodes: Any) -> None:
    html = owner_web.post("/submit/", {**VALID, "env": "not a var"}).content.decode()
    assert "Line 1 is not NAME=value" in html
    assert Job.objects.count() == 0


def test_token_is_shown_once_and_works(owner_web: Client, owner: Any) -> None:
    assert "You have no API token yet" in owner_web.get("/token/").content.decode()
    html = owner_web.post("/token/").content.decode()
    token = ApiToken.objects.get(user=owner)
    start = html.index('id="token-key" class="mono" readonly value="') + len(
        'id="token-key" class="mono" readonly value="'
    )
    key = html[start : html.index('"', start)]
    assert hashlib.sha256(key.encode()).hexdigest() == token.key_hash
    assert f"Authorization: Token {key}" in html and "curl -X POST" in html
    again = owner_web.get("/token/").content.decode()
    assert key not in again and token.prefix in again


def test_staff_change_scheduler_settings(staff_web: Client) -> None:
    pytest.importorskip("scheduler.cycle.config")
    from scheduler.cycle.config import settings_get

    html = staff_web.post(
        "/scheduler/", {"policy": "fcfs", "tick_seconds": "7", "params": '{"no_such": 1}'}
    ).content.decode()
    assert "no_such" in html and settings_get().tick_seconds != 7
    response = staff_web.post(
        "/scheduler/", {"policy": "fcfs", "tick_seconds": "7", "params": "{}"}
    )
    assert response.status_code == 302
    row = settings_get()
    assert (row.policy, row.tick_seconds) == ("fcfs", 7)
