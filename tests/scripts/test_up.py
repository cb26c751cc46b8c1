"""scripts/up.sh (`make up`) end to end: it serves with gunicorn and WhiteNoise, says "fleet is
up" only once /readyz answers and every agent it started has registered, and Ctrl-C stops every process it started, the
processes of running jobs included (they live in sessions of their own, under shims)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
UP = ROOT / "scripts" / "up.sh"
MARKS = ("3117", "3118")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _call(base: str, path: str, token: str | None = None, body: Any = None) -> Any:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode() if body else None)
    if token:
        req.add_header("Authorization", f"Token {token}")
    if body:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as response:
        return json.load(response)


def _job_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if any(f"sleep {m}" in cmdline for m in MARKS):
            found.append(proc)
    return found


def _gone(procs: list[psutil.Process]) -> list[str]:
    left = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{proc.pid} {' '.join(proc.cmdline())}")
        except psutil.NoSuchProcess:
            pass
    return left


def _interruptible() -> None:
    """Ctrl-C as a terminal delivers it: a test run started in the background by a
    non-interactive shell ignores SIGINT, every child inherits that, and bash cannot trap a
    signal ignored on entry, so up.sh would never see the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _diagnosis(proc: subprocess.Popen, out: Path) -> str:
    """What up.sh printed and what is left of its session, for a failure message."""
    left = []
    for p in psutil.process_iter(["pid", "ppid", "status", "cmdline"]):
        try:
            if os.getsid(p.info["pid"]) == proc.pid:
                left.append(f"{p.info['pid']} <- {p.info['ppid']} {p.info['status']} "
                            f"{' '.join(p.info['cmdline'] or [])[:160]}")  # fmt: skip
        except (OSError, psutil.Error):
            continue
    logs = []
    for log in sorted((out.parent / "var" / "log").glob("*.log")):
        logs.append(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}")
    return "\n".join([out.read_text(errors="replace")[-2000:], "--- left:", *left, *logs])


@pytest.fixture
def stack(tmp_path: Path) -> Any:
    """up.sh with its own var dir (SQLite) and port, in a process group of its own as a
    terminal would run it; killed whole if the test fails."""
    port = _free_port()
    out = tmp_path / "up.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.pop("DATABASE_URL", None)
    env.update(
        FLEET_VAR_DIR=str(tmp_path / "var"), FLEET_PORT=str(port), DEBUG="1",
        FLEET_UP_TIMEOUT="150", FLEET_UP_STOP_GRACE="5",
    )  # fmt: skip
    with open(out, "wb") as fh:
        proc = subprocess.Popen(
            [str(UP)], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_interruptible,
        )  # fmt: skip
    try:
        yield proc, out, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
        for job in _job_processes():
            job.kill()


def test_ready_only_when_agents_registered_and_ctrl_c_stops_jobs(stack: Any) -> None:
    proc, out, base = stack
    text = _wait_for(
        lambda: (t := out.read_text(errors="replace")) and ("fleet is up:" in t or
                 "not ready" in t or proc.poll() is not None) and t,
        timeout=300, what="up.sh to say it is up",
    )  # fmt: skip
    assert "fleet is up:" in text, text
    token = next(ln.split()[-1] for ln in text.splitlines() if "API token:" in ln)
    # When it says so, readiness and every agent it started are there already.
    with urllib.request.urlopen(base + "/readyz", timeout=10) as response:
        assert response.status == 200
        # Served by gunicorn, not Django's development server.
        assert response.headers["Server"].startswith("gunicorn"), response.headers["Server"]
    with urllib.request.urlopen(base + "/static/js/fleet.js", timeout=10) as response:
        assert response.status == 200 and response.read()  # static files through WhiteNoise
    nodes = {n["name"]: n for n in _call(base, "/api/v1/nodes/", token)}
    started = [ln.split()[0].removeprefix("agent-") for ln in text.splitlines()
               if ln.strip().startswith("agent-")]  # fmt: skip
    assert started and all(nodes[a]["last_heartbeat"] and nodes[a]["gpus"] for a in started)

    job = _call(base, "/api/v1/jobs/", token, {
        "name": "sleeper", "command": f"sleep {MARKS[0]} & sleep {MARKS[1]}; wait", "gpus": 1,
        "time_limit": 3600,
    })  # fmt: skip
    _wait_for(lambda: _call(base, f"/api/v1/jobs/{job['id']}/", token)["state"] == "running",
              timeout=90, what="the job to run")  # fmt: skip
    jobs = _wait_for(lambda: len(p := _job_processes()) >= 2 and p, 30, "the job's processes")
    shims = [p.parent() for p in jobs if p.parent() is not None]
    everything = jobs + shims + psutil.Process(proc.pid).children(recursive=True)

    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"up.sh still runs 120 s after Ctrl-C:\n{_diagnosis(proc, out)}")
    _wait_for(lambda: not _gone(everything), 15, "every process to stop")
    assert _gone(everything) == []
    assert _job_processes() == []
    text = out.read_text()
    assert "stopping fleet" in text
    # What it ran is requeued at once, not left running until the next `make up`.
    assert "requeued or failed 1 job(s) that ran on " in text and f": {job['id']}" in text, text
    db = sqlite3.connect(out.parent / "var" / "fleet.sqlite3")
    state, reason = db.execute(
        "SELECT state, state_reason FROM fleet_job WHERE id = ?", (job["id"],)
    ).fetchone()
    assert state == "pending" and "make up was stopped; requeued" in reason, (state, reason)
