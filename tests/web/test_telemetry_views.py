"""Telemetry on the dashboard: tiles show the latest cached reading, charts the history."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from fleet.models import TelemetrySample
from fleet.services.job_states import SCHEDULER, Actor, job_transition
from fleet.services.telemetry import LATEST_KEY
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def readings(fleet_nodes: Any) -> Any:
    gpu = fleet_nodes[0].gpus.get(index=1)
    now = timezone.now()
    for i, util in enumerate((10.0, 55.0, 97.0)):
        TelemetrySample.objects.create(
            gpu=gpu, sampled_at=now - timedelta(seconds=30 - i * 10), util_percent=util,
            memory_used_mb=1000 * (i + 1), memory_total_mb=81920, temperature_c=60.0,
            power_w=250.0,
        )  # fmt: skip
    key = LATEST_KEY.format(uuid=gpu.uuid)
    cache.set(key, {"index": 1, "util_percent": 97.4, "memory_used_mb": 40960,
                    "memory_total_mb": 81920, "temperature_c": 71.2, "power_w": 301.0,
                    "sampled_at": now.isoformat()})  # fmt: skip
    yield gpu
    cache.delete(key)


def test_tile_shows_the_latest_reading_in_numbers(owner_web: Client, readings: Any) -> None:
    html = owner_web.get("/fleet/").content.decode()
    assert "No telemetry yet" not in html
    tile = html[html.index('<span class="gi">GPU 1</span>') :][:600]
    assert '<span class="util">97%</span>' in tile
    assert "40960/81920 MB" in tile and "71°C · 301 W" in tile
    assert 'aria-label="memory 40960 of 81920 MB"' in tile
    assert html.count("util-4") == 1  # colour backs up the number, never replaces it


def test_node_chart_json_has_one_line_per_gpu(owner_web: Client, readings: Any) -> None:
    data = owner_web.get("/nodes/sim-a/telemetry.json?range=15m").json()
    assert data["available"] is True
    util = data["figures"]["util"]["data"]
    assert [(line["name"], line["y"]) for line in util] == [("GPU 1", [10.0, 55.0, 97.0])]


def test_job_chart_covers_its_gpus_over_its_life(
    owner_web: Client, owner: Any, team: Any, fleet_nodes: Any, readings: Any
) -> None:
    job = JobFactory(owner=owner, team=team)
    job_transition(job_id=job.pk, action="dispatch", actor=SCHEDULER,
                   fields={"node": fleet_nodes[0], "gpu_indices": [1]})  # fmt: skip
    job_transition(job_id=job.pk, action="start", actor=Actor.node("sim-a"))
    # Started after every reading: none of them is the job's.
    data = owner_web.get(f"/jobs/{job.pk}/telemetry.json").json()
    assert data == {"available": False, "message": "No telemetry yet for sim-a in this range."}
    job.started_at = timezone.now() - timedelta(minutes=1)
    job.save(update_fields=["started_at"])
    data = owner_web.get(f"/jobs/{job.pk}/telemetry.json").json()
    assert data["figures"]["util"]["data"][0]["y"] == [10.0, 55.0, 97.0]


@pytest.mark.parametrize("span", ["1h", "7d"])
def test_long_ranges_fall_back_to_raw_samples_before_rollups_exist(
    owner_web: Client, readings: Any, span: str
) -> None:
    data = owner_web.get(f"/nodes/sim-a/telemetry.json?range={span}").json()
    assert data["figures"]["util"]["data"][0]["y"] == [10.0, 55.0, 97.0]
