"""REST submit throughput: single jobs, bulk submits and job arrays against a live server.

Creates (drops first) a PostgreSQL database, migrates it, builds a fleet of --nodes nodes x
8 A100s, one team and one user with an API token, then starts gunicorn on it (production
settings, --workers processes x --threads threads) and measures over HTTP with keep-alive
connections:

1. single-job POSTs to /api/v1/jobs/ with 1 and with 8 concurrent clients (--single
   requests each run);
2. bulk submits (POST /api/v1/jobs/bulk/) and arrays (POST /api/v1/jobs/ with "array") of
   each size in --sizes, --repeat times each.

It prints jobs/s and p50/p95 latency of each run, and the ratio of bulk and array
throughput to single submits (8 clients) in the same run. Then, in process, it counts the
SQL queries of one request of each kind (CaptureQueriesContext). Issue 13's targets: single
>= 200 jobs/s, bulk/array >= 2,000 jobs/s on PostgreSQL. On a shared machine the figures
are noisy: run it with `nice`, and say so with what it prints.

    .venv/bin/python bench/bench_submit.py [--nodes 100] [--single 400] \\
        [--sizes 1000,10000] [--repeat 3] [--workers 2] [--threads 4] \\
        [--database-url postgres://postgres@127.0.0.1:5432/fleet_bench_submit] \\
        [--redis-url redis://127.0.0.1:6379/1]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument(
        "--single",
        type=int,
        default=400,
        help="requests per single-job run (0: none, bulk and arrays only)",
    )
    p.add_argument("--sizes", default="1000,10000", help="bulk and array sizes")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    p.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker")
    p.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/fleet_bench_submit"
    )
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/1")
    return p.parse_args()


def configure(args: argparse.Namespace) -> dict[str, str]:
    env = {
        "DATABASE_URL": args.database_url,
        "REDIS_URL": args.redis_url,
        "DJANGO_SETTINGS_MODULE": "fleet.settings",
        "SECRET_KEY": "bench-submit-not-a-secret-" + "x" * 40,
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
        "FLEET_SSL_REDIRECT": "0",
        "FLEET_SECURE_COOKIES": "0",
        "LOG_LEVEL": "WARNING",
        "FLEET_MAX_ARRAY_SIZE": str(max(10_000, *sizes(args))),
        "FLEET_MAX_BULK_JOBS": str(max(10_000, *sizes(args))),
    }
    os.environ.update(env)
    return env


def sizes(args: argparse.Namespace) -> list[int]:
    return [int(s) for s in args.sizes.split(",") if s.strip()]


def recreate_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def build(nodes: int) -> str:
    """The fleet, a team and a user; the user's API token."""
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from fleet.models import Gpu, Membership, Node, Team
    from fleet.services.tokens import token_rotate

    call_command("migrate", verbosity=0)
    team = Team.objects.create(slug="bench", name="Bench", guaranteed_gpus=8 * nodes)
    user = User.objects.create_user("bench", password="x")
    Membership.objects.create(user=user, team=team, is_default=True)
    Node.objects.bulk_create(
        Node(name=f"gpu{i:04d}", gpu_backend="simulated", state="up", cpus=128,
             memory_mb=1 << 20)
        for i in range(nodes)
    )  # fmt: skip
    Gpu.objects.bulk_create(
        Gpu(node=n, index=i, uuid=f"GPU-{n.pk}-{i}", model="A100-80GB", memory_mb=81920)
        for n in Node.objects.all()
        for i in range(8)
    )
    return token_rotate(user=user)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(args: argparse.Namespace, env: dict[str, str], port: int) -> subprocess.Popen:
    gunicorn = Path(sys.executable).with_name("gunicorn")
    proc = subprocess.Popen(
        [str(gunicorn), "fleet.wsgi", "--bind", f"127.0.0.1:{port}",
         "--workers", str(args.workers), "--threads", str(args.threads),
         "--timeout", "300", "--log-level", "warning"],
        cwd=ROOT, env={**os.environ, **env}, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("gunicorn did not answer /healthz within 60 s")


class Api:
    """One keep-alive connection. Bodies are encoded once by the caller where they repeat,
    and answers parsed only where they are read: the client shares the machine's CPUs with
    the server it measures (run_single reports what it used)."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}

    def post(self, path: str, body: Any, *, parse: bool = True) -> tuple[float, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        start = time.perf_counter()
        self.conn.request("POST", path, body=data, headers=self.headers)
        response = self.conn.getresponse()
        payload = response.read()
        took = time.perf_counter() - start
        if response.status != 201:
            raise SystemExit(f"POST {path}: {response.status} {payload[:300]!r}")
        return took, json.loads(payload) if parse else None


def cpu_seconds(*, pgid: int | None = None, pids: frozenset[int] = frozenset()) -> float:
    """CPU time (user + system) of the live processes in a process group (the server) or
    among `pids` (PostgreSQL's backends)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid or int(entry) in pids:  # fields[2]: the process group
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def backend_pids(database_url: str) -> frozenset[int]:
    """PostgreSQL's backends serving the benchmark's database (PostgreSQL on this host)."""
    import psycopg

    name = urlsplit(database_url).path.lstrip("/")
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        ).fetchall()
    return frozenset(pid for (pid,) in rows)


def machine_busy_seconds() -> float:
    """CPU time the whole machine spent busy (every process: server, PostgreSQL, Redis,
    the client and whatever else runs)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


JOB = {"name": "bench", "command": "python train.py", "gpus": 1, "time_limit": 600}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def report(label: str, jobs: int, wall: float, latencies: list[float]) -> float:
    rate = jobs / wall
    print(
        f"{label:<28} {jobs:>7} jobs {wall:>8.2f} s {rate:>9.0f} jobs/s   "
        f"p50 {pct(latencies, 0.5) * 1000:>8.1f} ms  p95 {pct(latencies, 0.95) * 1000:>8.1f} ms"
    )
    return rate


def run_single(
    port: int, token: str, clients: int, total: int, server_pgid: int, database_url: str
) -> float:
    latencies: list[float] = []
    lock = threading.Lock()
    per_client = [total // clients + (1 if i < total % clients else 0) for i in range(clients)]
    body = json.dumps(JOB).encode()

    def client(n: int) -> None:
        api = Api(port, token)
        api.post("/api/v1/jobs/", body)  # connect and warm up outside the clock
        barrier.wait()
        mine = [api.post("/api/v1/jobs/", body, parse=False)[0] for _ in range(n)]
        with lock:
            latencies.extend(mine)

    barrier = threading.Barrier(clients + 1)
    threads = [threading.Thread(target=client, args=(n,)) for n in per_client]
    for t in threads:
        t.start()
    while barrier.n_waiting < clients:  # every client warmed up: the backends are open
        time.sleep(0.01)
    backends = backend_pids(database_url)
    cpu = (
        time.process_time(),
        cpu_seconds(pgid=server_pgid),
        cpu_seconds(pids=backends),
        machine_busy_seconds(),
    )
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    client_cpu = time.process_time() - cpu[0]
    server_cpu = cpu_seconds(pgid=server_pgid) - cpu[1]
    # Backends opened during the run (a thread's first query) count whole.
    database_cpu = cpu_seconds(pids=backends | backend_pids(database_url)) - cpu[2]
    busy = machine_busy_seconds() - cpu[3]
    rate = report(f"single, {clients} client{'s' if clients > 1 else ''}", total, wall, latencies)
    print(
        f"{'':<28} CPU per job: web {server_cpu / total * 1000:.2f} ms, PostgreSQL "
        f"backends {database_cpu / total * 1000:.2f} ms, client {client_cpu / total * 1000:.2f}"
        f" ms, whole machine {busy / total * 1000:.2f} ms ({busy / wall:.2f} of "
        f"{os.cpu_count()} CPUs busy)"
    )
    return rate


def run_many(port: int, token: str, kind: str, size: int, repeat: int) -> float:
    api = Api(port, token)
    # A small request of the same kind first, outside the clock: every worker's first
    # request pays for imports and connections (with --single 0 nothing else warmed them).
    for _ in range(2):
        if kind == "bulk":
            api.post("/api/v1/jobs/bulk/", {"jobs": [JOB] * 2})
        else:
            api.post("/api/v1/jobs/", {**JOB, "array": 2})
    latencies = []
    for _ in range(repeat):
        if kind == "bulk":
            took, body = api.post("/api/v1/jobs/bulk/", {"jobs": [JOB] * size})
            assert body["count"] == size
        else:
            took, body = api.post("/api/v1/jobs/", {**JOB, "array": size})
            assert body["task_count"] == size
        latencies.append(took)
    return report(f"{kind} of {size:,} (x{repeat})", size * repeat, sum(latencies), latencies)


def count_queries(token: str) -> None:
    """Queries of one request of each kind, in process (the first request of each is a
    warm-up: content types and the like are cached after it)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_AUTHORIZATION=f"Token {token}")

    def queries(path: str, body: Any) -> int:
        client.post(path, body, content_type="application/json")
        with CaptureQueriesContext(connection) as ctx:
            response = client.post(path, body, content_type="application/json")
        assert response.status_code == 201, response.content[:300]
        return len(ctx.captured_queries)

    client.post("/api/v1/jobs/", JOB, content_type="application/json")  # warm-up
    start = time.process_time()
    for _ in range(200):
        response = client.post("/api/v1/jobs/", JOB, content_type="application/json")
    per_submit = (time.process_time() - start) / 200
    assert response.status_code == 201, response.content[:300]
    print(
        f"\nCPU per single submit in process (test client, 200 submits): {per_submit * 1000:.2f} ms"
    )
    print("\nSQL queries per request (in process; BEGIN/COMMIT not counted):")
    print(f"  single submit:        {queries('/api/v1/jobs/', JOB)}")
    print(f"  bulk of 1,000:        {queries('/api/v1/jobs/bulk/', {'jobs': [JOB] * 1000})}")
    print(f"  array of 1,000:       {queries('/api/v1/jobs/', {**JOB, 'array': 1000})}")


def main() -> None:
    args = parse_args()
    env = configure(args)
    recreate_database(args.database_url)
    token = build(args.nodes)
    port = free_port()
    print(
        f"fleet: {args.nodes} nodes x 8 GPUs; gunicorn {args.workers} workers x "
        f"{args.threads} threads; PostgreSQL {urlsplit(args.database_url).path.lstrip('/')}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    server = start_server(args, env, port)
    try:
        single_1 = single_8 = 0.0
        if args.single > 0:  # --single 0: bulk and arrays only
            single_1 = run_single(
                port, token, 1, max(1, args.single // 4), server.pid, args.database_url
            )
            single_8 = run_single(port, token, 8, args.single, server.pid, args.database_url)
        rates: dict[str, float] = {}
        for size in sizes(args):
            for kind in ("bulk", "array"):
                rates[f"{kind} of {size:,}"] = run_many(port, token, kind, size, args.repeat)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    best_single = max(single_1, single_8)
    if best_single > 0:
        print(
            f"\nratio to single submits ({best_single:.0f} jobs/s, the better of 1 and 8 clients):"
        )
        for label, rate in rates.items():
            print(f"  {label:<18} {rate / best_single:>6.1f}x")
    count_queries(token)
    print(f"\nload average after the run: {os.getloadavg()[0]:.1f} (figures under load are noisy)")


if __name__ == "__main__":
    main()
