"""How many GPU telemetry samples per second the control side ingests.

Runs the ingest service (latest samples to the cache, rows to the Redis buffer, one bulk
insert per batch) on simulated 8-GPU nodes, against the configured database (PostgreSQL
when DATABASE_URL is set, else SQLite) and the Redis cache at REDIS_URL, in a throwaway
test database. Baselines measured in the same run on the same rows: one bulk insert per
tick (a commit per message), and one INSERT per sample.

    .venv/bin/python bench/bench_telemetry_ingest.py [--nodes 20] [--ticks 25]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if not os.environ.get("DATABASE_URL"):
    os.environ.pop("DATABASE_URL", None)
    os.environ["FLEET_VAR_DIR"] = tempfile.mkdtemp(prefix="fleet-bench-")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleet.settings")
os.environ.setdefault("DEBUG", "1")  # a development set-up: a generated SECRET_KEY will do
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

from workers.gpu import SimulatedGpuBackend  # noqa: E402
from workers.telemetry import telemetry_payload  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--ticks", type=int, default=25)
    args = parser.parse_args()

    setup_test_environment()
    # A separate test database, so the benchmark never touches real data.
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        run(args.nodes, args.ticks)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


def run(n_nodes: int, ticks: int) -> None:
    from fleet.models import Node, TelemetrySample
    from fleet.services.agents import agent_register, node_key_create
    from fleet.services.telemetry import telemetry_flush, telemetry_ingest, telemetry_rollup

    call_command("migrate", verbosity=0)
    clock = [time.time() - 600.0]
    nodes: list[tuple[Node, SimulatedGpuBackend]] = []
    for i in range(n_nodes):
        backend = SimulatedGpuBackend("8xA100-80GB", node_name=f"bench-{i}", clock=lambda: clock[0])
        node, _ = node_key_create(name=f"bench-{i}")
        agent_register(node=node, backend="simulated", agent_version="bench",
                       gpus=[g.to_dict() for g in backend.inventory()])  # fmt: skip
        nodes.append((node, backend))

    def payloads() -> list[tuple[Node, dict]]:
        out = []
        for _ in range(ticks):
            clock[0] += 5.0
            for node, backend in nodes:
                out.append((node, telemetry_payload(node_name=node.name, backend_name="simulated",
                                                    samples=backend.sample(), job_by_pid={})))  # fmt: skip
        return out

    batch = payloads()
    samples = sum(len(p["gpus"]) for _, p in batch)
    start = time.perf_counter()
    for node, payload in batch:
        telemetry_ingest(node=node, payload=payload)
    telemetry_flush()
    ingest_s = time.perf_counter() - start

    from datetime import UTC, datetime

    from django.db import transaction

    gpu_ids = {g.uuid: g.pk for n, _ in nodes for g in n.gpus.all()}

    def rows(payload: dict) -> list[TelemetrySample]:
        return [
            TelemetrySample(
                gpu_id=gpu_ids[g["uuid"]],
                sampled_at=datetime.fromtimestamp(g["sampled_at"], UTC),
                util_percent=g["util_percent"],
                memory_used_mb=g["memory_used_mb"],
                memory_total_mb=g["memory_total_mb"],
                temperature_c=g["temperature_c"],
                power_w=g["power_w"],
                sm_clock_mhz=g["sm_clock_mhz"],
            )  # fmt: skip
            for g in payload["gpus"]
        ]

    # Baseline 1: one bulk insert (one commit) per tick.
    batch = payloads()
    start = time.perf_counter()
    for _, payload in batch:
        with transaction.atomic():
            TelemetrySample.objects.bulk_create(rows(payload))
    per_tick_s = time.perf_counter() - start
    # Baseline 2: one INSERT per sample.
    batch = payloads()
    start = time.perf_counter()
    for _, payload in batch:
        for row in rows(payload):
            row.save()
    single_s = time.perf_counter() - start

    start = time.perf_counter()
    rolled = telemetry_rollup()
    rollup_s = time.perf_counter() - start

    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    print(f"database: {db}; {n_nodes} nodes x 8 GPUs x {ticks} ticks = {samples} samples")
    print(f"ingest service (cache + buffered bulk insert): {samples / ingest_s:,.0f} samples/s "
          f"({len(batch) / ingest_s:,.0f} ticks/s)")  # fmt: skip
    print(f"baseline, one bulk insert per tick:           {samples / per_tick_s:,.0f} samples/s")
    print(f"baseline, one INSERT per sample:              {samples / single_s:,.0f} samples/s")
    print(f"ratio ingest / per-tick bulk insert: {per_tick_s / ingest_s:.1f}x; "
          f"ingest / per-sample insert: {single_s / ingest_s:.1f}x")  # fmt: skip
    fleet_rate = samples / ingest_s / (8 / 5.0)
    print(f"one control worker keeps up with ~{fleet_rate:,.0f} 8-GPU nodes at a 5 s tick")
    print(f"rollup of {3 * samples} raw samples: {rolled['rolled']} rollups in {rollup_s:.2f} s")


if __name__ == "__main__":
    main()
