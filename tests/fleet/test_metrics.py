"""/metrics: scraped and parsed as Prometheus does, values checked against what the test
stored; only staff tokens and the metrics token may scrape."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleet.models import Gpu, JobEvent, JobMember, TelemetrySample
from scheduler.models import CycleRecord
from tests.factories import GpuFactory, JobFactory, NodeFactory

pytestmark = pytest.mark.django_db


def _scrape(client: Client, **headers: Any) -> dict[str, Any]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    families = text_string_to_metric_families(response.content.decode())
    return {f.name: f for f in families}


def _values(family: Any, suffix: str = "") -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for s in family.samples
        if s.name == family.name + suffix
    }


def _sample(gpu: Gpu, age: timedelta, **values: Any) -> None:
    TelemetrySample.objects.create(
        gpu=gpu, sampled_at=timezone.now() - age, memory_total_mb=gpu.memory_mb, **values
    )


@pytest.fixture
def stored(fleet_nodes: Any, owner: Any, outsider: Any, team: Any, other_team: Any) -> dict:
    a, b = fleet_nodes
    a0, a1, a2 = (Gpu.objects.get(node=a, index=i) for i in range(3))
    b0, b1 = (Gpu.objects.get(node=b, index=i) for i in range(2))
    # An older and a newer reading of a0: only the newer one is shown.
    _sample(a0, timedelta(seconds=40), util_percent=10.0, memory_used_mb=100,
            temperature_c=40.0, power_w=100.0)  # fmt: skip
    _sample(a0, timedelta(seconds=4), util_percent=87.5, memory_used_mb=30000,
            temperature_c=61.0, power_w=310.5)  # fmt: skip
    _sample(a1, timedelta(seconds=6), util_percent=12.0, memory_used_mb=2048,
            temperature_c=45.0, power_w=None)  # fmt: skip
    _sample(a2, timedelta(seconds=5), util_percent=0.0, memory_used_mb=0,
            temperature_c=30.0, power_w=60.0)  # fmt: skip
    # b0's newest reading is 20 minutes old: not shown. sim-old sent nothing since; its lag
    # says so.
    old_gpu: Any = GpuFactory(node=NodeFactory(name="sim-old"), index=0)
    _sample(old_gpu, timedelta(minutes=20), util_percent=1.0)
    _sample(b0, timedelta(minutes=20), util_percent=99.0, memory_used_mb=1,
            temperature_c=80.0, power_w=250.0)  # fmt: skip
    # A two-node job: rank 0 on a3, rank 1 on b1; its first attempt's member on a2 is over.
    _sample(b1, timedelta(seconds=3), util_percent=50.0, memory_used_mb=5,
            temperature_c=50.0, power_w=150.0)  # fmt: skip
    gang: Any = JobFactory(owner=outsider, team=other_team, state="running", node=a,
                           gpu_indices=[3], gpus=2, gpus_per_node=1, attempt=2)  # fmt: skip
    JobMember.objects.create(job=gang, attempt=2, rank=0, node=a, gpu_indices=[3])
    JobMember.objects.create(job=gang, attempt=2, rank=1, node=b, gpu_indices=[1])
    JobMember.objects.create(job=gang, attempt=1, rank=1, node=a, gpu_indices=[2])
    # Two fractional jobs share a1; a whole-GPU job holds a0.
    JobFactory(owner=owner, team=team, state="running", node=a, gpu_indices=[0], gpus=1)
    shared = [
        JobFactory(owner=owner, team=team, state="running", node=a, gpu_indices=[1], gpus=0,
                   gpu_memory_mb=1000, gpu_compute_percent=50),
        JobFactory(owner=outsider, team=other_team, state="assigned", node=a, gpu_indices=[1],
                   gpus=0, gpu_memory_mb=1000, gpu_compute_percent=25),
    ]  # fmt: skip
    for _ in range(3):
        JobFactory(owner=owner, team=team)  # pending
    JobFactory(owner=outsider, team=other_team, state="held")
    done: Any = JobFactory(owner=owner, team=team, state="succeeded")
    failed: Any = JobFactory(owner=owner, team=team, state="failed")
    ev = {"attempt": 1, "actor_kind": "node"}
    JobEvent.objects.create(job=done, from_state="running", to_state="succeeded", **ev)
    JobEvent.objects.create(job=failed, from_state="running", to_state="failed", **ev)
    # A job that failed, was requeued and failed again: two failures.
    JobEvent.objects.create(job=failed, from_state="running", to_state="failed", **ev)
    # Recorded but not applied (a duplicate report): not an outcome.
    JobEvent.objects.create(job=done, from_state="succeeded", to_state="succeeded",
                            applied=False, **ev)  # fmt: skip
    now = timezone.now()
    for ms in (3.0, 40.0, 40.0, 700.0, 12000.0):
        CycleRecord.objects.create(started_at=now, finished_at=now, duration_ms=ms, policy="fcfs")
    return {"shared": shared, "gang": gang}


def test_gpu_readings_with_dcgm_names_and_job_labels(stored: dict, staff: Any) -> None:
    client = Client()
    client.force_login(staff)
    metrics = _scrape(client)
    util = _values(metrics["DCGM_FI_DEV_GPU_UTIL"])
    by_gpu = {dict(k)["uuid"]: (dict(k), v) for k, v in util.items()}
    shown = {g.uuid for g in Gpu.objects.filter(node__name="sim-a", index__lt=3)}
    gang_gpu = Gpu.objects.get(node__name="sim-b", index=1)
    assert set(by_gpu) == shown | {gang_gpu.uuid}
    # The second member of the multi-node job is labelled with it, on its own node.
    member, _ = by_gpu[gang_gpu.uuid]
    assert (member["node"], member["job"], member["team"]) == (
        "sim-b", str(stored["gang"].pk), "speech"
    )  # fmt: skip
    labels, value = by_gpu[Gpu.objects.get(node__name="sim-a", index=0).uuid]
    assert value == 87.5
    assert (labels["node"], labels["gpu"], labels["modelName"], labels["team"],
            labels["user"]) == ("sim-a", "0", "A100-80GB", "vision", "owner")  # fmt: skip
    shared, _ = by_gpu[Gpu.objects.get(node__name="sim-a", index=1).uuid]
    ids = sorted(str(j.pk) for j in stored["shared"])
    assert shared["job"] == ",".join(ids)
    assert (shared["team"], shared["user"]) == ("speech,vision", "owner,outsider")
    idle, _ = by_gpu[Gpu.objects.get(node__name="sim-a", index=2).uuid]
    assert (idle["job"], idle["team"]) == ("", "")  # an earlier attempt's member is not shown

    def on_a(name: str) -> dict[str, float]:
        values = _values(metrics[name]).items()
        return {dict(k)["gpu"]: v for k, v in values if dict(k)["node"] == "sim-a"}

    assert on_a("DCGM_FI_DEV_FB_USED") == {"0": 30000.0, "1": 2048.0, "2": 0.0}
    assert on_a("DCGM_FI_DEV_GPU_TEMP") == {"0": 61.0, "1": 45.0, "2": 30.0}
    assert on_a("DCGM_FI_DEV_POWER_USAGE") == {"0": 310.5, "2": 60.0}  # a1 sent no power
    lag = {dict(k)["node"]: v for k, v in _values(metrics["fleet_telemetry_lag_seconds"]).items()}
    assert 4 <= lag["sim-a"] < 60 and 3 <= lag["sim-b"] < 60
    assert 20 * 60 <= lag["sim-old"] < 21 * 60


def test_queue_outcomes_nodes_and_cycles(stored: dict, staff_api: Any) -> None:
    token = staff_api._credentials["HTTP_AUTHORIZATION"]
    metrics = _scrape(Client(), HTTP_AUTHORIZATION=token)
    jobs = {tuple(v for _, v in k): n for k, n in _values(metrics["fleet_jobs"]).items()}
    assert jobs == {
        ("running", "vision"): 2, ("assigned", "speech"): 1, ("running", "speech"): 1, ("pending", "vision"): 3,
        ("held", "speech"): 1,
    }  # fmt: skip
    finished = {dict(k)["outcome"]: v for k, v in _values(metrics["fleet_jobs_finished"],
                                                          "_total").items()}  # fmt: skip
    assert finished == {"succeeded": 1, "failed": 2, "cancelled": 0, "timeout": 0, "lost": 0}
    assert _values(metrics["fleet_nodes"]) == {(("state", "up"),): 3.0}
    cycle = metrics["fleet_scheduler_cycle_duration_seconds"]
    buckets = {s.labels["le"]: s.value for s in cycle.samples if s.name.endswith("_bucket")}
    assert (buckets["0.005"], buckets["0.05"], buckets["1.0"], buckets["10.0"]) == (1, 3, 4, 4)
    assert buckets["+Inf"] == 5
    # The text format carries a gauge histogram's count and sum as gauges of their own.
    gsum = metrics["fleet_scheduler_cycle_duration_seconds_gsum"].samples[0].value
    gcount = metrics["fleet_scheduler_cycle_duration_seconds_gcount"].samples[0].value
    assert (gsum, gcount) == (pytest.approx(12.783), 5)
    cycles = _values(metrics["fleet_scheduler_cycles"], "_total")
    assert list(cycles.values()) == [CycleRecord.objects.latest("id").pk]


def test_who_may_scrape(stored: dict, owner_api: Any, staff_api: Any, monkeypatch: Any) -> None:
    client = Client()
    assert client.get("/metrics").status_code == 401
    owner_token = owner_api._credentials["HTTP_AUTHORIZATION"]
    refused = client.get("/metrics", HTTP_AUTHORIZATION=owner_token)
    assert refused.status_code == 403 and b"staff" in refused.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token nope").status_code == 401
    # No metrics token configured: a bearer is never accepted, even an empty one.
    monkeypatch.delenv("FLEET_METRICS_TOKEN", raising=False)
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401
    monkeypatch.setenv("FLEET_METRICS_TOKEN", "s3cret-scrape-token")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    assert ok.status_code == 200 and b"DCGM_FI_DEV_GPU_UTIL" in ok.content
    assert client.post("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token").status_code in (
        403,
        405,
    )


def test_ingest_buffer_and_refused_readings(stored: dict, staff_api: Any) -> None:
    from django.core.cache import cache

    from fleet.services.telemetry import BUFFER_KEY, telemetry_refused_key

    client = cache._cache.get_client(write=True)  # type: ignore[attr-defined]
    buffer, refused = cache.make_key(BUFFER_KEY), telemetry_refused_key("sim-b")
    client.delete(buffer, refused)
    try:
        client.rpush(buffer, "{}", "{}", "{}")
        client.hset(refused, mapping={"temperature_c": 2, "util_percent": 1, "total": 3})
        token = staff_api._credentials["HTTP_AUTHORIZATION"]
        metrics = _scrape(Client(), HTTP_AUTHORIZATION=token)
    finally:
        client.delete(buffer, refused)
    assert _values(metrics["fleet_telemetry_buffered_samples"]) == {(): 3.0}
    counts = _values(metrics["fleet_telemetry_refused"], "_total")
    assert counts == {
        (("field", "temperature_c"), ("node", "sim-b")): 2.0,
        (("field", "util_percent"), ("node", "sim-b")): 1.0,
    }
