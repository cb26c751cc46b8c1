"""Telemetry on the control side: ingest into cache and history, rollups, retention, API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.cache import cache

from fleet.models import Node, TelemetryRollup, TelemetrySample
from fleet.services.agents import agent_register, node_key_create
from fleet.services.telemetry import (
    BUFFER_KEY,
    FLUSH_TIMER_KEY,
    LATEST_KEY,
    telemetry_flush,
    telemetry_ingest,
    telemetry_rollup,
)
from workers.gpu import SimulatedGpuBackend
from workers.telemetry import telemetry_payload

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 10, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start.timestamp()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sim() -> tuple[Node, SimulatedGpuBackend, Clock]:
    clock = Clock(T0)
    name = "tele-node"
    backend = SimulatedGpuBackend("2xA100-80GB", node_name=name, seed=1, clock=clock)
    node, _ = node_key_create(name=name)
    agent_register(
        node=node,
        backend="simulated",
        agent_version="t",
        gpus=[g.to_dict() for g in backend.inventory()],
    )
    cache.delete_many([LATEST_KEY.format(uuid=g.uuid) for g in backend.inventory()])
    cache.delete_many([BUFFER_KEY, FLUSH_TIMER_KEY])
    return node, backend, clock


def tick(
    node: Node,
    backend: SimulatedGpuBackend,
    job_by_pid: dict[int, Any] | None = None,
    now: datetime = T0,
) -> int:
    payload = telemetry_payload(
        node_name=node.name,
        backend_name="simulated",
        samples=backend.sample(),
        job_by_pid=job_by_pid or {},
    )
    return telemetry_ingest(node=node, payload=payload, now=now)


def test_ingest_keeps_the_latest_sample_in_the_cache_and_appends_history(sim: Any) -> None:
    node, backend, clock = sim
    backend.register_job_process(4242, [1], env={"FLEET_SIM_UTIL": "70"})
    for _ in range(3):
        assert tick(node, backend, {4242: 99}) == 2
        clock.now += 5
    # The first tick is written at once; the next ones wait in the buffer for the batch.
    assert TelemetrySample.objects.filter(gpu__node=node).count() == 2
    assert telemetry_flush() == 4
    assert TelemetrySample.objects.filter(gpu__node=node).count() == 6
    busy = cache.get(LATEST_KEY.format(uuid=backend.uuid(1)))
    idle = cache.get(LATEST_KEY.format(uuid=backend.uuid(0)))
    assert busy["processes"] == [{"pid": 4242, "used_memory_mb": 16384, "job_id": 99}]
    assert 60 < busy["util_percent"] <= 80 and idle["util_percent"] < 10
    assert busy["sampled_at"] == (T0 + timedelta(seconds=10)).isoformat()
    assert busy["memory_total_mb"] == 81920


def test_samples_for_unregistered_gpus_are_dropped(sim: Any) -> None:
    node, backend, _ = sim
    other = SimulatedGpuBackend("1xV100", node_name="elsewhere", clock=lambda: T0.timestamp())
    payload = telemetry_payload(
        node_name=node.name, backend_name="simulated", samples=other.sample(), job_by_pid={}
    )
    assert telemetry_ingest(node=node, payload=payload) == 0
    telemetry_flush()
    assert not TelemetrySample.objects.exists()


def test_rollup_folds_closed_minutes_and_retention_deletes_old_rows(sim: Any) -> None:
    node, backend, clock = sim
    for _ in range(24):  # two minutes at 5 s
        tick(node, backend)
        clock.now += 5
    result = telemetry_rollup(now=T0 + timedelta(minutes=1, seconds=30))
    assert result["rolled"] == 2  # the first minute of each GPU; the second is not over
    first = TelemetryRollup.objects.get(gpu__uuid=backend.uuid(0), minute=T0)
    assert first.samples == 12 and first.memory_total_mb == 81920
    # Idempotent, and the second minute is folded once it is over.
    telemetry_rollup(now=T0 + timedelta(minutes=2, seconds=1))
    telemetry_rollup(now=T0 + timedelta(minutes=2, seconds=2))
    assert TelemetryRollup.objects.count() == 4
    assert TelemetryRollup.objects.get(gpu=first.gpu, minute=T0).samples == 12
    # An hour later raw samples are gone; a week later the rollups too.
    result = telemetry_rollup(now=T0 + timedelta(hours=1, minutes=3))
    assert result["raw_deleted"] == 48 and not TelemetrySample.objects.exists()
    assert TelemetryRollup.objects.count() == 4
    telemetry_rollup(now=T0 + timedelta(days=7, minutes=3))
    assert not TelemetryRollup.objects.exists()


def test_node_detail_shows_each_gpus_latest_sample(sim: Any, owner_api: Any) -> None:
    node, backend, _ = sim
    tick(node, backend)
    gpus = owner_api.get(f"/api/v1/nodes/{node.name}/").json()["gpus"]
    latest = gpus[0]["latest"]
    assert set(latest) == {
        "util_percent", "memory_used_mb", "memory_total_mb", "temperature_c", "power_w",
        "sampled_at",
    }  # fmt: skip
    assert latest["memory_total_mb"] == 81920 and latest["temperature_c"] > 20
    assert latest["sampled_at"].startswith("2026-03-02T10:00:00")


def test_history_api_returns_raw_for_recent_ranges_and_rollups_for_old_ones(
    sim: Any, owner_api: Any
) -> None:
    node, backend, clock = sim
    clock.now = (datetime.now(UTC) - timedelta(minutes=10)).timestamp()
    for _ in range(12):
        tick(node, backend, now=datetime.now(UTC))
        clock.now += 5
    telemetry_flush()
    url = f"/api/v1/nodes/{node.name}/telemetry/"
    recent = owner_api.get(url, {"gpu": 1}).json()
    assert recent["resolution"] == "raw"
    assert [g["index"] for g in recent["gpus"]] == [1]
    assert len(recent["gpus"][0]["points"]) == 12
    telemetry_rollup()
    since = (datetime.now(UTC) - timedelta(days=2)).isoformat()
    old = owner_api.get(url, {"since": since}).json()
    assert old["resolution"] == "1m"
    points = old["gpus"][0]["points"]
    assert 1 <= len(points) <= 2 and points[0]["util_percent"] is not None
    bad = owner_api.get(url, {"since": "2026-03-02T10:00:00Z", "until": "2026-03-01T10:00:00Z"})
    assert bad.status_code == 400


def test_history_api_refuses_people_outside_every_team(sim: Any, stranger_api: Any) -> None:
    node = sim[0]
    assert stranger_api.get(f"/api/v1/nodes/{node.name}/telemetry/").status_code == 403
