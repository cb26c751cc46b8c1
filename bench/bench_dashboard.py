"""What the live dashboard costs the database, and how fast the fleet page renders.

Builds a fleet of --nodes nodes x 8 GPUs (about 60 % busy, a latest telemetry reading per
GPU in the cache) and 500 pending jobs in an in-memory SQLite database, then:

1. renders the full fleet page (all nodes on one page) and the default first page,
   printing the best of --repeat wall times;
2. counts the queries of one render of each live partial a dashboard polls
   (django.test.utils.CaptureQueriesContext), splits them into per-request auth queries
   and data queries, and prints the queries per second that --dashboards open
   dashboards cause at one poll every 2 s: without fragment sharing (the baseline,
   every poll renders) and with it (one render per sharing window per page).

    .venv/bin/python bench/bench_dashboard.py [--nodes 1000] [--dashboards 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["DATABASE_URL"] = "sqlite://:memory:"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleet.settings")
os.environ.setdefault("DEBUG", "1")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_test_environment  # noqa: E402
from django.utils import timezone  # noqa: E402

from fleet.models import Gpu, Job, JobEvent, Membership, Node, Team  # noqa: E402
from fleet.web import live  # noqa: E402

LOCMEM = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


def build(nodes: int, seed: int = 1) -> tuple[Any, Job, Node]:
    rng = random.Random(seed)
    from django.contrib.auth.models import User

    team = Team.objects.create(slug="vision", name="Vision", guaranteed_gpus=64)
    user = User.objects.create_user("viewer", password="x")
    Membership.objects.create(user=user, team=team, is_default=True)
    Node.objects.bulk_create(
        Node(name=f"gpu{i:04d}", gpu_backend="simulated", state="up") for i in range(nodes)
    )
    node_rows = list(Node.objects.order_by("id"))
    Gpu.objects.bulk_create(
        Gpu(node=n, index=i, uuid=f"GPU-{n.pk}-{i}", model="A100-80GB", memory_mb=81920)
        for n in node_rows
        for i in range(8)
    )
    now = timezone.now()
    jobs = []
    for n in node_rows:
        i = 0
        while i < 8:
            size = rng.choice((1, 1, 2, 4))
            if i + size <= 8 and rng.random() < 0.6:
                jobs.append(
                    Job(owner=user, team=team, name=f"train-{n.pk}-{i}", command="python t.py",
                        gpus=size, time_limit=3600, state="running", node=n,
                        gpu_indices=list(range(i, i + size)), started_at=now, attempt=1)
                )  # fmt: skip
            i += size
    jobs += [
        Job(owner=user, team=team, name=f"wait-{k}", command="x", gpus=1, time_limit=60,
            queue_position=k + 1, state_reason="waiting for free GPUs")
        for k in range(500)
    ]  # fmt: skip
    Job.objects.bulk_create(jobs, batch_size=2000)
    job = Job.objects.filter(state="running").first()
    assert job is not None
    JobEvent.objects.bulk_create(
        JobEvent(job=job, from_state=a, to_state=b, attempt=1, actor_kind="system")
        for a, b in (("", "pending"), ("pending", "assigned"), ("assigned", "running"))
    )
    # The latest reading of every GPU, as the telemetry ingest caches it.
    from fleet.services.telemetry import LATEST_KEY

    stamp = now.isoformat()
    cache.set_many(
        {
            LATEST_KEY.format(uuid=g.uuid): {
                "index": g.index, "util_percent": rng.uniform(0, 100),
                "memory_used_mb": rng.randint(0, 81920), "memory_total_mb": 81920,
                "temperature_c": rng.uniform(30, 85), "power_w": rng.uniform(60, 400),
                "sampled_at": stamp,
            }
            for g in Gpu.objects.all()
        },
        timeout=3600,
    )  # fmt: skip
    return user, job, node_rows[0]


def best_time(client: Client, url: str, repeat: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(url)
        times.append(time.perf_counter() - start)
        assert response.status_code == 200, (url, response.status_code)
        size = len(response.content)
    return min(times), size


def count(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, HTTP_HX_REQUEST="true")
    assert response.status_code == 200, (url, response.status_code)
    return len(ctx.captured_queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--dashboards", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    setup_test_environment()
    with override_settings(CACHES=LOCMEM, FLEET_WEB_LIVE_CACHE_SECONDS=0):
        call_command("migrate", verbosity=0, run_syncdb=True)
        t0 = time.perf_counter()
        user, job, node = build(args.nodes)
        print(f"fleet: {args.nodes} nodes x 8 GPUs, {Job.objects.count()} jobs "
              f"(built in {time.perf_counter() - t0:.1f} s)")  # fmt: skip
        client = Client()
        client.force_login(user)

        full, size = best_time(client, f"/fleet/?per_page={args.nodes}", args.repeat)
        first, _ = best_time(client, "/fleet/", args.repeat)
        print(
            f"fleet page, all {args.nodes} nodes on one page: {full * 1000:.0f} ms "
            f"(best of {args.repeat}, {size / 1e6:.1f} MB of HTML); target < 1000 ms"
        )
        print(f"fleet page, default first page ({100} nodes): {first * 1000:.0f} ms")

        partials = {
            "fleet": "/fleet/?partial=1",
            "queue": "/queue/?partial=1",
            "job": f"/jobs/{job.pk}/?partial=1",
            "node": f"/nodes/{node.name}/?partial=1",
        }
        unshared = {name: count(client, url) for name, url in partials.items()}
        with override_settings(FLEET_WEB_LIVE_CACHE_SECONDS=600):
            shared = {}
            for name, url in partials.items():
                count(client, url)  # fills the shared fragment
                shared[name] = count(client, url)
        poll = live.POLL_SECONDS
        window = float(getattr(settings, "FLEET_WEB_LIVE_CACHE_SECONDS", 0.5)) or 0.5
        print(f"\nqueries per render of each live partial (one poll every {poll} s):")
        print(f"{'partial':8} {'render':>7} {'cached':>7} {'qps, no sharing':>16} "
              f"{'qps, shared':>12} {'ratio':>6}")  # fmt: skip
        for name in partials:
            # With the fragment shared, a poll costs only the per-request floor: session,
            # user and team membership lookups.
            per_request = shared[name]
            data = unshared[name] - per_request
            baseline = args.dashboards * unshared[name] / poll
            # Pages whose fragment is shared (fleet, queue "all") render once a window;
            # job and node partials are per object and rendered on every poll.
            is_shared = per_request < unshared[name]
            with_sharing = args.dashboards * per_request / poll + (
                data / window if is_shared else 0
            )
            print(f"{name:8} {unshared[name]:>7} {per_request:>7} {baseline:>16.0f} "
                  f"{with_sharing:>12.0f} {baseline / with_sharing:>6.2f}")  # fmt: skip
        print(f"\n{args.dashboards} dashboards, each on the fleet page: "
              f"{args.dashboards * unshared['fleet'] / poll:.0f} queries/s without sharing, "
              f"{args.dashboards * shared['fleet'] / poll + (unshared['fleet'] - shared['fleet']) / window:.0f} "
              f"queries/s with fragments shared for {window:g} s")  # fmt: skip


if __name__ == "__main__":
    main()
