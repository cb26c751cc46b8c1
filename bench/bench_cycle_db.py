"""Time whole scheduling cycles against a real database, beside the pure policy's time.

Fills a scratch database with 1,000 nodes x 8 GPUs, 10,000 pending jobs (1/2/4/8-GPU gangs
and fractions, 12 teams, 60 users) and 5,000 finished jobs for the runtime predictor, then
runs `scheduler.cycle.runner.run_cycle()` (lock, snapshot, policy, apply, ETAs, waits,
record) and prints the milliseconds of each step. Scenarios:

- steady: about 98 % of the GPUs busy, so a cycle places a few jobs. "cold" is the first
  cycle (forecasts ETAs and writes every waiting job's reason, position and ETA); "next"
  is the one after (no ETA forecast within "eta_interval", writes only what changed);
  "+eta" forecasts ETAs as well (eta_interval 0);
- burst: about 60 % busy, so one cycle dispatches thousands of jobs, one compare-and-swap
  transition each (prints the cost per dispatch);
- warm burst (after the steady rows, in the same process, so the worker's kept rows and
  objects are warm): running jobs holding about 1,000 GPUs end and 1,000 one-GPU jobs
  arrive at the top priority, then one cycle dispatches them ("warm burst") and the cycle
  after it runs ("warm after"). Within "eta_interval" of the last forecast and 5 s of it,
  as a burst right after a forecast is: no ETA in it.
- reclaim (after those, same process): the agents report the ends of the jobs preempted so
  far, then a team with a guarantee and nothing running submits --reclaim one-GPU jobs on
  the full fleet; the cycle preempts borrowers' jobs up to the cap ("reclaim"), and the
  one after it runs ("reclaim after").

The pure figure is `policy.schedule(snapshot)` on the snapshot the cycle built (best of
three), the part that needs no database. "cycle ms" is the cycle the scheduler lock is held
for (its record's duration: snapshot, policy, apply, waits and the queue order); "eta" is
the ETA forecast that follows it outside the lock when one is due, and "total" the whole
call, forecast included. "CPU ms" is the CPU time of the whole call in this process (the
database server's is not in it): the figure to compare on a busy machine.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet_bench \\
        .venv/bin/python bench/bench_cycle_db.py [--policy priority] [--pending 10000]

The database named in DATABASE_URL is emptied and refilled: never point it at real data.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/fleet_bench")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleet.settings")
os.environ.setdefault("DEBUG", "1")  # a development set-up: a generated SECRET_KEY will do

MODELS = (("A100-80GB", 81920), ("H100-80GB", 81920), ("V100-32GB", 32768))


def _create_database() -> None:
    from urllib.parse import urlparse

    url = urlparse(os.environ["DATABASE_URL"])
    if not url.scheme.startswith("postgres"):
        return
    import psycopg

    name = url.path.lstrip("/")
    admin = url._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def _setup() -> None:
    _create_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill(*, nodes: int, pending: int, busy: float, seed: int) -> dict[str, int]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from fleet.models import Gpu, Job, JobEvent, Node, Team
    from scheduler.models import CycleRecord, TeamUsage

    rng = random.Random(seed)
    tables = [m._meta.db_table for m in (JobEvent, Job, Gpu, Node, TeamUsage, CycleRecord)]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        else:
            for table in tables:
                cursor.execute(f"DELETE FROM {table}")
    User = get_user_model()
    teams = [
        Team.objects.get_or_create(
            slug=f"team{i}",
            defaults={"name": f"Team {i}", "guaranteed_gpus": 400, "gpu_limit": 4000},
        )[0]
        for i in range(12)
    ]
    users = [User.objects.get_or_create(username=f"bench{i}")[0] for i in range(60)]
    now = timezone.now()
    node_rows = Node.objects.bulk_create(
        [Node(name=f"node{n:04d}", state="up", gpu_backend="simulated") for n in range(nodes)]
    )
    gpus, running = [], []
    for n, node in enumerate(node_rows):
        model, memory = MODELS[n % len(MODELS)]
        gpus += [
            Gpu(node=node, index=i, uuid=f"GPU-{n}-{i}", model=model, memory_mb=memory)
            for i in range(8)
        ]
        g = 0
        while g < 8:
            if rng.random() < busy:
                size = min(rng.choice((1, 1, 2, 4, 8)), 8 - g)
                owner = rng.choice(users)
                running.append(
                    Job(
                        owner=owner, team=teams[owner.pk % 12], name=f"run{rng.randrange(40)}",
                        command="x", gpus=size, time_limit=rng.choice((3600, 4 * 3600, 86400)),
                        state="running", attempt=1, node=node, gpu_indices=list(range(g, g + size)),
                        assigned_at=now, started_at=now - timedelta(seconds=rng.randrange(3600)),
                        preemptible=rng.random() < 0.3,
                    )
                )  # fmt: skip
                g += size
            else:
                g += 1
    Gpu.objects.bulk_create(gpus)
    jobs = []
    for _ in range(pending):
        owner = rng.choice(users)
        fraction = rng.random() < 0.15
        jobs.append(
            Job(
                owner=owner, team=teams[owner.pk % 12], name=f"train{rng.randrange(40)}",
                command="x", gpus=0 if fraction else rng.choice((1, 1, 1, 2, 2, 4, 8)),
                gpu_memory_mb=rng.choice((8000, 16000)) if fraction else None,
                gpu_compute_percent=rng.choice((25, 50)) if fraction else None,
                time_limit=rng.choice((1800, 3600, 4 * 3600, 86400)),
                priority=rng.randrange(-20, 21), preemptible=rng.random() < 0.3,
            )
        )  # fmt: skip
    history = []
    for _ in range(5000):
        owner = rng.choice(users)
        limit = rng.choice((3600, 4 * 3600))
        ended = now - timedelta(seconds=rng.randrange(1, 7 * 86400))
        history.append(
            Job(
                owner=owner, team=teams[owner.pk % 12], name=f"train{rng.randrange(40)}",
                command="x", gpus=1, time_limit=limit, state="succeeded", attempt=1,
                started_at=ended - timedelta(seconds=rng.uniform(0.1, 1.0) * limit),
                finished_at=ended,
            )
        )  # fmt: skip
    Job.objects.bulk_create(history + running + jobs, batch_size=2000)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE")
    return {"running": len(running), "pending": pending, "gpus": len(gpus)}


def burst(*, gpus: int, arrivals: int, seed: int) -> tuple[int, int]:
    """End running jobs holding about `gpus` GPUs (as if their agents reported success) and
    submit `arrivals` one-GPU jobs at the top priority; returns (jobs ended, GPUs freed)."""
    from django.utils import timezone

    from fleet.models import Job, JobState

    rng = random.Random(seed)
    running = list(
        Job.objects.filter(state=JobState.RUNNING).values_list("id", "gpus", "owner_id", "team_id")
    )
    rng.shuffle(running)
    ended, freed = [], 0
    for job_id, size, _, _ in running:
        if freed >= gpus:
            break
        ended.append(job_id)
        freed += size
    now = timezone.now()
    Job.objects.filter(id__in=ended).update(
        state=JobState.SUCCEEDED, finished_at=now, exit_code=0, updated_at=now
    )
    owners = [(owner, team) for _, _, owner, team in running[:60]]
    Job.objects.bulk_create(
        [
            Job(
                owner_id=owner, team_id=team, name=f"burst{i % 40}", command="x", gpus=1,
                time_limit=3600, priority=100,
            )
            for i, (owner, team) in enumerate(rng.choice(owners) for _ in range(arrivals))
        ],
        batch_size=1000,
    )  # fmt: skip
    return len(ended), freed


def reclaim(*, arrivals: int) -> None:
    """A team with a guarantee and nothing running submits `arrivals` one-GPU jobs while
    every other team borrows: it may preempt the borrowers' preemptible jobs. The agents
    of the jobs preempted earlier have reported their ends first (each cycle's preemptions
    count against the cap until then)."""
    from django.contrib.auth import get_user_model

    from fleet.models import GpuRelease, Job, Team
    from fleet.services.releases import gpu_release_done

    for job_id, attempt in GpuRelease.objects.values_list("job_id", "attempt").distinct():
        gpu_release_done(job_id=job_id, attempt=attempt)

    team = Team.objects.get_or_create(
        slug="returning", defaults={"name": "Returning", "guaranteed_gpus": 400, "gpu_limit": 4000}
    )[0]
    owner = get_user_model().objects.get_or_create(username="returning")[0]
    Job.objects.bulk_create(
        [
            Job(owner=owner, team=team, name=f"back{i % 10}", command="x", gpus=1, time_limit=900)
            for i in range(arrivals)
        ]
    )


def _snapshot_aside() -> object:
    """A snapshot for the pure figure that leaves what the cycles keep between them (rows,
    job and node objects) as the last cycle left it: the next cycle then reads what a
    production cycle would."""
    from scheduler.cycle import snapshot_jobs, snapshot_nodes, snapshot_rows
    from scheduler.cycle.snapshot import build_snapshot

    kept = [snapshot_rows.KEPT, snapshot_jobs.CARRIED, snapshot_nodes.CARRIED_NODES]
    saved = [{k: dict(v) if isinstance(v, dict) else v for k, v in vars(o).items()} for o in kept]
    try:
        return build_snapshot(save_usage=False)
    finally:
        for obj, state in zip(kept, saved, strict=True):
            vars(obj).update(state)


def pure_ms(policy_name: str) -> float:
    from scheduler.policies import get_policy

    snap: Any = _snapshot_aside()
    best = float("inf")
    for _ in range(3):
        policy = get_policy(policy_name, **snap.params)
        t0 = time.perf_counter()
        policy.schedule(snap.core)
        best = min(best, (time.perf_counter() - t0) * 1000)
    return best


def cycle(label: str, pure: float) -> None:
    from scheduler.cycle.runner import run_cycle

    t0, c0 = time.perf_counter(), time.process_time()
    record = run_cycle()
    total = (time.perf_counter() - t0) * 1000
    cpu = (time.process_time() - c0) * 1000
    assert record is not None, "the scheduler lock is held elsewhere"
    # The cycle itself (lock, snapshot, policy, apply, waits and order, record); a forecast
    # due after it runs once the lock is released, and counts in "total" only.
    wall = record.duration_ms
    t = record.timings
    per = ""
    if record.placed:
        # The starts leave as each batch commits; the waits are written after the last one.
        sent = t["snapshot_ms"] + t["policy_ms"] + t["apply_ms"]
        per = f"  ({t['apply_ms'] / record.placed:.2f} ms per dispatch, all sent by {sent:.0f} ms)"
    print(
        f"{label:<14}{wall:>9.0f}{cpu:>8.0f}{pure:>9.0f}{wall / pure:>7.1f}x"
        f"{t['snapshot_ms']:>9.0f}{t['policy_ms']:>8.0f}{t['apply_ms']:>8.0f}"
        f"{t.get('eta_ms', 0):>7.0f}"
        f"{t['waits_ms']:>7.0f}{t['waits_written']:>8.0f}{record.placed:>7}{record.preempted:>6}"
        f"{total:>8.0f}{per}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policy", default="priority")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--pending", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--skip-burst", action="store_true")
    p.add_argument("--burst-gpus", type=int, default=1000)
    p.add_argument("--arrivals", type=int, default=1000)
    p.add_argument("--reclaim", type=int, default=300)
    args = p.parse_args()
    _setup()
    from django.db import connection

    from fleet.services import messaging
    from scheduler.cycle.config import settings_update

    messaging._send = lambda *a, **k: None  # no broker here: count nothing, send nothing
    settings_update(user=None, policy=args.policy, params={})
    print(f"database: {connection.vendor}; policy {args.policy}")
    print(
        f"{'scenario':<14}{'cycle ms':>9}{'CPU ms':>8}{'pure ms':>9}{'ratio':>8}"
        f"{'snapshot':>9}{'policy':>8}{'apply':>8}{'eta':>7}{'waits':>7}{'written':>8}"
        f"{'placed':>7}{'preempt':>6}{'total':>8}"
    )
    scenarios = [("steady", 0.98)] + ([] if args.skip_burst else [("burst", 0.6)])
    for name, busy in scenarios:
        sizes = fill(nodes=args.nodes, pending=args.pending, busy=busy, seed=args.seed)
        print(f"# {name}: {sizes['running']} running jobs, {sizes['pending']} pending, "
              f"{sizes['gpus']} GPUs")  # fmt: skip
        settings_update(user=None, params={})
        pure = pure_ms(args.policy)
        cycle(f"{name} cold", pure)  # forecasts ETAs, writes every waiting job
        pure = pure_ms(args.policy)
        cycle(f"{name} next", pure)  # within eta_interval: no forecast, writes changes only
        settings_update(user=None, params={"eta_interval": 0})
        cycle(f"{name} +eta", pure)  # forecast every cycle
        if name == "steady":
            settings_update(user=None, params={})
            ended, freed = burst(gpus=args.burst_gpus, arrivals=args.arrivals, seed=args.seed)
            print(f"# {ended} running jobs end ({freed} GPUs), {args.arrivals} jobs arrive")
            cycle("warm burst", pure)
            cycle("warm after", pure)
            # On the full fleet, a team within its guarantee reclaims GPUs from the
            # borrowers: the cycle preempts up to its cap.
            reclaim(arrivals=args.reclaim)
            print(f"# a team within its guarantee submits {args.reclaim} jobs on the full fleet")
            cycle("reclaim", pure)
            cycle("reclaim after", pure)


if __name__ == "__main__":
    main()
