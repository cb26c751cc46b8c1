"""Telemetry is checked reading by reading: a bad value (Infinity, NaN, negative, absurd,
a string, a missing field, a payload of the wrong shape) is refused and counted on its node,
the other readings of the message and of other nodes are kept, and no page or API answer
fails on a bad value, even one an older version stored."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.db import DataError, IntegrityError
from django.test import Client
from django.utils import timezone

from fleet.models import TelemetryRollup, TelemetrySample
from fleet.selectors.telemetry import telemetry_refused
from fleet.services.agents import agent_register, node_key_create
from fleet.services.telemetry import (
    BUFFER_KEY,
    FLUSH_TIMER_KEY,
    LATEST_KEY,
    telemetry_flush,
    telemetry_ingest,
    telemetry_refused_key,
    telemetry_rollup,
)
from workers.gpu import SimulatedGpuBackend
from workers.telemetry import telemetry_payload

pytestmark = pytest.mark.django_db


def redis() -> Any:
    return cache._cache.get_client(write=True)  # type: ignore[attr-defined]


class Host:
    """One registered node with two simulated GPUs whose clock is the real time."""

    def __init__(self, name: str) -> None:
        self.backend = SimulatedGpuBackend(
            "2xA100-80GB", node_name=name, seed=1, clock=lambda: timezone.now().timestamp()
        )
        self.node, _ = node_key_create(name=name)
        inventory = self.backend.inventory()
        agent_register(
            node=self.node,
            backend="simulated",
            agent_version="t",
            gpus=[g.to_dict() for g in inventory],
        )
        self.uuids = [g.uuid for g in inventory]
        cache.delete_many([LATEST_KEY.format(uuid=u) for u in self.uuids])
        redis().delete(telemetry_refused_key(name))

    def payload(self, **bad: Any) -> dict[str, Any]:
        """A tick of both GPUs; `bad` replaces fields of GPU 1's reading (a value of
        `...` removes the field)."""
        payload = telemetry_payload(
            node_name=self.node.name,
            backend_name="simulated",
            samples=self.backend.sample(),
            job_by_pid={},
        )
        for name, value in bad.items():
            if value is ...:
                del payload["gpus"][1][name]
            else:
                payload["gpus"][1][name] = value
        return payload

    def stored(self, index: int) -> int:
        return TelemetrySample.objects.filter(gpu__node=self.node, gpu__index=index).count()


@pytest.fixture
def hosts() -> tuple[Host, Host]:
    cache.delete_many([BUFFER_KEY, FLUSH_TIMER_KEY])
    return Host("val-a"), Host("val-b")


@pytest.fixture
def web(owner: Any, settings: Any) -> Client:
    settings.FLEET_WEB_LIVE_CACHE_SECONDS = 0
    client = Client()
    client.force_login(owner)
    return client


BAD_READINGS = {
    "infinity": {"util_percent": math.inf},
    "nan": {"temperature_c": math.nan},
    "negative utilization": {"util_percent": -50.0},
    "negative temperature": {"temperature_c": -273.0},
    "absurd memory": {"memory_used_mb": 10**30},
    "absurd power": {"power_w": 1e30},
    "a string": {"power_w": "hot"},
    "a missing field": {"memory_total_mb": ...},
    "a wrong type": {"sm_clock_mhz": [1]},
    "a bad process": {"processes": [{"pid": "x", "used_memory_mb": 1}]},
}


@pytest.mark.parametrize("bad", BAD_READINGS.values(), ids=BAD_READINGS.keys())
def test_a_bad_reading_is_refused_and_counted_and_the_rest_is_kept(
    hosts: tuple[Host, Host], owner_api: Any, web: Client, bad: dict[str, Any]
) -> None:
    a, b = hosts
    # Another node's readings wait in the same buffer: they must survive the bad one.
    assert telemetry_ingest(node=b.node, payload=b.payload()) == 2
    assert telemetry_ingest(node=a.node, payload=a.payload(**bad)) == 1
    assert telemetry_rollup()["rolled"] >= 0  # the flush inside it does not fail
    assert (a.stored(0), a.stored(1), b.stored(0), b.stored(1)) == (1, 0, 1, 1)
    assert cache.get(LATEST_KEY.format(uuid=a.uuids[1])) is None
    assert cache.get(LATEST_KEY.format(uuid=a.uuids[0]))["memory_total_mb"] == 81920
    field = next(iter(bad))
    assert telemetry_refused(node=a.node) == {field: 1, "total": 1}
    assert telemetry_refused(node=b.node) == {}
    assert owner_api.get(f"/api/v1/nodes/{a.node.name}/telemetry/").status_code == 200
    assert owner_api.get("/api/v1/nodes/").status_code == 200
    assert web.get("/fleet/").status_code == 200


@pytest.mark.parametrize(
    "payload",
    [["not", "a", "payload"], "garbage", None, {"gpus": "abc"}, {"gpus": 5}],
    ids=["list", "string", "null", "gpus a string", "gpus a number"],
)
def test_a_payload_of_the_wrong_shape_is_refused_and_counted(
    hosts: tuple[Host, Host], payload: Any
) -> None:
    a, _ = hosts
    assert telemetry_ingest(node=a.node, payload=payload) == 0
    assert telemetry_refused(node=a.node) == {"payload": 1, "total": 1}


def test_bad_per_job_usage_is_refused_and_the_readings_kept(hosts: tuple[Host, Host]) -> None:
    a, _ = hosts
    payload = a.payload()
    payload["jobs"] = {"7": {"memory_mb": math.nan, "gpu_indices": [0]}, "x" * 300: {}}
    assert telemetry_ingest(node=a.node, payload=payload) == 2
    assert telemetry_refused(node=a.node) == {"jobs": 2, "total": 2}
    payload["jobs"] = "nonsense"
    assert telemetry_ingest(node=a.node, payload=payload) == 2


def test_readings_of_another_nodes_gpu_or_far_from_now_are_refused(
    hosts: tuple[Host, Host],
) -> None:
    a, b = hosts
    payload = a.payload()
    payload["gpus"][0]["uuid"] = b.uuids[0]  # b's GPU, reported by a
    payload["gpus"][1]["sampled_at"] = timezone.now().timestamp() + 10 * 365 * 86400
    assert telemetry_ingest(node=a.node, payload=payload) == 0
    assert telemetry_refused(node=a.node) == {"uuid": 1, "sampled_at": 1, "total": 2}
    telemetry_flush()
    assert not TelemetrySample.objects.exists()


def test_a_bad_row_already_in_the_buffer_costs_only_itself(hosts: tuple[Host, Host]) -> None:
    a, b = hosts
    gpu_a = a.node.gpus.get(index=0)
    gpu_b = b.node.gpus.get(index=0)
    at = timezone.now().timestamp()
    rows = [
        [gpu_a.pk, at, 1e30, 10**30, 81920, 50.0, 200.0, 1400],  # an older version's row
        [gpu_a.pk, at, "x", 1, 81920, 50.0, 200.0, 1400],
        "not json",
        [gpu_b.pk, at, 40.0, 1000, 81920, 50.0, 200.0, 1400],
    ]
    redis().rpush(
        cache.make_key(BUFFER_KEY), *(r if isinstance(r, str) else json.dumps(r) for r in rows)
    )
    assert telemetry_flush() == 1
    assert list(TelemetrySample.objects.values_list("gpu_id", "util_percent")) == [(gpu_b.pk, 40.0)]


def test_bad_values_already_stored_never_break_a_reader(
    hosts: tuple[Host, Host], owner_api: Any, web: Client
) -> None:
    a, _ = hosts
    gpu = a.node.gpus.get(index=0)
    now = timezone.now()
    minute = (now - timedelta(minutes=3)).replace(second=0, microsecond=0)
    for i, (util, temp) in enumerate(
        [(math.inf, math.nan), (-50.0, -273.0), (1e30, 60.0), (40.0, 70.0)]
    ):
        TelemetrySample.objects.create(
            gpu=gpu, sampled_at=minute + timedelta(seconds=i), util_percent=util,
            memory_used_mb=-5, memory_total_mb=81920, temperature_c=temp, power_w=math.inf,
        )  # fmt: skip
    cache.set(
        LATEST_KEY.format(uuid=gpu.uuid),
        {"util_percent": math.nan, "memory_used_mb": 10**30, "memory_total_mb": 81920,
         "temperature_c": math.inf, "power_w": -1.0, "sampled_at": now.isoformat()},
    )  # fmt: skip
    raw = owner_api.get(f"/api/v1/nodes/{a.node.name}/telemetry/", {"gpu": 0})
    assert raw.status_code == 200
    points = raw.json()["gpus"][0]["points"]
    assert [p["util_percent"] for p in points] == [None, None, None, 40.0]
    assert {p["power_w"] for p in points} == {None}
    nodes = owner_api.get("/api/v1/nodes/")
    assert nodes.status_code == 200
    latest = next(n for n in nodes.json() if n["name"] == "val-a")["gpus"][0]["latest"]
    assert latest["util_percent"] is None and latest["memory_used_mb"] is None
    assert web.get("/fleet/").status_code == 200
    assert web.get(f"/nodes/{a.node.name}/telemetry.json?range=15m").status_code == 200

    # The rollup folds only the usable values of that minute.
    telemetry_rollup(now=now)
    rollup = TelemetryRollup.objects.get(gpu=gpu, minute=minute)
    assert rollup.samples == 4
    assert (rollup.util_percent, rollup.util_percent_max) == (40.0, 40.0)
    assert (rollup.temperature_c, rollup.temperature_c_max) == (65.0, 70.0)
    assert rollup.power_w is None and rollup.memory_used_mb is None
    since = (now - timedelta(days=2)).isoformat()
    old = owner_api.get(f"/api/v1/nodes/{a.node.name}/telemetry/", {"since": since, "gpu": 0})
    assert old.status_code == 200 and old.json()["resolution"] == "1m"


def test_the_rollup_still_runs_when_the_flush_fails(
    hosts: tuple[Host, Host], monkeypatch: Any
) -> None:
    a, _ = hosts
    gpu = a.node.gpus.get(index=0)
    minute = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
    TelemetrySample.objects.create(
        gpu=gpu, sampled_at=minute, util_percent=10.0, memory_total_mb=81920
    )

    def broken(**_: Any) -> int:
        raise ConnectionError("redis went away")

    monkeypatch.setattr("fleet.services.telemetry.telemetry_flush", broken)
    assert telemetry_rollup(now=minute + timedelta(minutes=2))["rolled"] == 1


def test_staff_see_a_nodes_refused_readings_on_its_page(
    hosts: tuple[Host, Host], staff: Any, web: Client
) -> None:
    a, _ = hosts
    telemetry_ingest(node=a.node, payload=a.payload(temperature_c=-273.0))
    admin = Client()
    admin.force_login(staff)
    page = admin.get(f"/nodes/{a.node.name}/").content.decode()
    assert "Refused telemetry readings from this node: 1" in page
    assert "(temperature_c: 1);" in page
    assert "Refused telemetry" not in web.get(f"/nodes/{a.node.name}/").content.decode()


def test_a_batch_the_database_refuses_is_stored_row_by_row(
    hosts: tuple[Host, Host], monkeypatch: Any
) -> None:
    a, b = hosts
    gpu_a, gpu_b = a.node.gpus.get(index=0), b.node.gpus.get(index=0)
    at = timezone.now().timestamp()
    rows = [[gpu.pk, at, 40.0, 1000, 81920, 50.0, 200.0, 1400] for gpu in (gpu_a, gpu_b, gpu_a)]
    redis().rpush(cache.make_key(BUFFER_KEY), *(json.dumps(r) for r in rows))

    def refuse_batch(*_: Any, **__: Any) -> None:
        raise DataError("a value the database cannot hold")

    real_save = TelemetrySample.save

    def refuse_b(sample: TelemetrySample, *args: Any, **kwargs: Any) -> None:
        if sample.gpu_id == gpu_b.pk:  # e.g. its GPU was deleted since the check
            raise IntegrityError("violates foreign key constraint")
        real_save(sample, *args, **kwargs)

    monkeypatch.setattr(TelemetrySample.objects, "bulk_create", refuse_batch)
    monkeypatch.setattr(TelemetrySample, "save", refuse_b)
    assert telemetry_flush() == 2
    assert list(TelemetrySample.objects.values_list("gpu_id", flat=True)) == [gpu_a.pk] * 2
