"""The submit form's fields for multi-node jobs and host resources, and their errors."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from fleet.models import Job

pytestmark = pytest.mark.django_db

FORM = {
    "name": "llm",
    "command": "torchrun train.py",
    "team": "vision",
    "gpus": "6",
    "gpus_per_node": "3",
    "cpus": "8",
    "memory_mb": "16000",
    "priority": "0",
    "qos": "normal",
    "max_requeues": "3",
}


def test_the_form_submits_a_job_over_two_nodes_with_its_cpus_and_memory(
    owner_web: Client, racks: Any
) -> None:
    html = owner_web.get("/submit/").content.decode()
    for name in ("gpus_per_node", "same_group", "cpus", "memory_mb"):
        assert f'for="id_{name}"' in html and f'id="id_{name}_helptext"' in html, name

    response = owner_web.post("/submit/", {**FORM, "same_group": "on"})

    job = Job.objects.get(name="llm")
    assert response.status_code == 302, response.content.decode()[:2000]
    assert (job.gpus, job.gpus_per_node, job.nodes, job.cpus, job.memory_mb, job.same_group) == (
        6, 3, 2, 8, 16000, True
    )  # fmt: skip


def test_gpus_that_do_not_split_evenly_are_an_error_next_to_the_field(
    owner_web: Client, racks: Any
) -> None:
    html = owner_web.post("/submit/", {**FORM, "gpus_per_node": "4"}).content.decode()
    assert Job.objects.count() == 0
    assert 'id="id_gpus_error"' in html
    assert "must be a multiple of gpus_per_node (4)" in html and "ask for 4 or 8" in html


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("cpus", "-1", "Ensure this value is greater than or equal to 0."),
        ("memory_mb", "lots", "Enter a whole number."),
        ("gpus_per_node", "0", "Ensure this value is greater than or equal to 1."),
    ],
)
def test_a_bad_number_is_named_next_to_its_field(
    owner_web: Client, racks: Any, field: str, value: str, says: str
) -> None:
    html = owner_web.post("/submit/", {**FORM, field: value}).content.decode()
    assert Job.objects.count() == 0
    assert f'id="id_{field}_error">{says}<' in html
