"""Submit to running on an idle GPU: the `make up` stack on PostgreSQL, one job at a time.

Creates (drops first) a PostgreSQL database, starts `scripts/up.sh` on it (gunicorn, the
control worker, beat and the three simulated agents, exactly as `make up` runs them) with a
private var dir and port, waits until it says it is up, then submits --jobs one-GPU jobs
one after the other, each only once the one before has ended (so a GPU is always idle),
and --gap seconds after it (0: at once, inside the scheduling window its end opened; more
than the window: a quiet fleet, where the submit's own cycle runs at once).
For each job it prints nothing; at the end it prints p50, p95 and max of

- submit to running as the server recorded it (started_at - submitted_at: the cycle, the
  signed start message, the agent starting the job and its report applied);
- submit to running as a client sees it (from the POST until GET shows "running", polled
  every 20 ms).

Issue 13's target: p50 <= 0.3 s. On a shared machine the figures are noisy.

    .venv/bin/python bench/bench_submit_latency.py [--jobs 30] \\
        [--database-url postgres://postgres@127.0.0.1:5432/fleet_bench_latency]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_submit import free_port, pct, recreate_database  # noqa: E402


def call(base: str, path: str, token: str, body: Any = None) -> Any:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode() if body else None)
    req.add_header("Authorization", f"Token {token}")
    if body:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as response:
        return json.load(response)


def start_stack(database_url: str, var: Path, port: int) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(
        DATABASE_URL=database_url, FLEET_VAR_DIR=str(var), FLEET_PORT=str(port), DEBUG="1",
        FLEET_UP_TIMEOUT="180",
    )  # fmt: skip
    out = var.parent / "up.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen(
            [str(ROOT / "scripts" / "up.sh")], cwd=ROOT, env=env, stdout=fh,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        text = out.read_text(errors="replace")
        if "fleet is up:" in text:
            token = next(ln.split()[-1] for ln in text.splitlines() if "API token:" in ln)
            return proc, token
        if "not ready" in text or proc.poll() is not None:
            break
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    raise SystemExit(f"the stack did not come up:\n{out.read_text(errors='replace')[-3000:]}")


def seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=30)
    p.add_argument(
        "--gap", type=float, default=0.0,
        help="seconds to wait after a job ends before the next submit (a quiet fleet)",
    )  # fmt: skip
    p.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/fleet_bench_latency"
    )
    a = p.parse_args()
    recreate_database(a.database_url)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="fleet-latency-") as tmp:
        proc, token = start_stack(a.database_url, Path(tmp) / "var", port)
        try:
            server, client = [], []
            for i in range(a.jobs):
                t0 = time.perf_counter()
                job = call(base, "/api/v1/jobs/", token, {
                    "name": f"latency-{i}", "command": "sleep 0.2", "gpus": 1, "time_limit": 60,
                })  # fmt: skip
                seen = None
                while time.perf_counter() - t0 < 30:
                    got = call(base, f"/api/v1/jobs/{job['id']}/", token)
                    if seen is None and got["state"] in ("running", "succeeded"):
                        seen = time.perf_counter() - t0
                    if got["state"] in ("succeeded", "failed", "cancelled"):
                        break
                    time.sleep(0.02)
                if got.get("started_at") is None or seen is None:
                    raise SystemExit(f"job {job['id']} did not run: {got['state']}")
                server.append(seconds(got["submitted_at"], got["started_at"]))
                client.append(seen)
                time.sleep(a.gap)
            for label, values in (("server (started_at - submitted_at)", server),
                                  ("client (POST until GET says running)", client)):  # fmt: skip
                print(
                    f"{label:40} p50 {pct(values, 0.5):.3f} s  p95 {pct(values, 0.95):.3f} s  "
                    f"max {max(values):.3f} s  ({len(values)} jobs)"
                )
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
