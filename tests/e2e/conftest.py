"""Browser tests against the real pieces: pytest-django's live_server, a control worker
(Celery, consuming a control queue unique to the test) and a simulated GPU agent
(`python -m workers.agent --node NAME --simulate SPEC`), all sharing one database.

The subprocesses cannot see an in-memory SQLite test database, so when this folder is
collected the test database is a file (DATABASES["default"]["TEST"]["NAME"]), or the
Postgres test database when DATABASE_URL points at Postgres; the subprocesses get its URL.
Chromium is Debian's (/usr/bin/chromium), headless.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "var" / "artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]

# Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
# still synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

_DB = settings.DATABASES["default"]
if _DB["ENGINE"].endswith("sqlite3"):
    # Set at collection, before any test database exists, so the whole session uses it.
    _DB.setdefault("TEST", {})["NAME"] = str(
        Path(tempfile.gettempdir()) / f"fleet-e2e-{os.getpid()}.sqlite3"
    )


def database_url() -> str:
    """The URL of the test database, for the subprocesses."""
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db.get("USER") or ""
    if db.get("PASSWORD"):
        auth += f":{db['PASSWORD']}"
    host = db.get("HOST") or "127.0.0.1"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}@{host}{port}/{db['NAME']}"


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@dataclass
class Stack:
    control_queue: str
    env: dict[str, str]
    logs: Path
    procs: list[Proc]

    def spawn(self, name: str, argv: list[str], extra: dict[str, str] | None = None) -> Proc:
        log = self.logs / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv, cwd=REPO, env={**self.env, **(extra or {})}, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        started = Proc(name, proc, log)
        self.procs.append(started)
        return started

    def start_agent(self, node: str, simulate: str = "2xA100-80GB") -> Proc:
        """A simulated agent for a new node, registered through the control worker."""
        from fleet.services.agents import node_key_create
        from fleet.services.wire import control_public_key

        _, key = node_key_create(name=node)
        agent_env = {k: v for k, v in self.env.items() if not k.startswith(("DJANGO", "DATABASE"))}
        agent_env.update(
            FLEET_NODE_KEY=key,
            FLEET_CONTROL_PUBLIC_KEY=control_public_key(),
            FLEET_CONTROL_QUEUE=self.control_queue,
            FLEET_AGENT_STATE_DIR=str(self.logs / f"agent-{node}"),
            FLEET_HEARTBEAT_INTERVAL="1",
            FLEET_TELEMETRY_INTERVAL="1",
            FLEET_LOG_SHIP_INTERVAL="0.5",
            FLEET_SUPERVISE_INTERVAL="0.2",
            # As root, jobs run as nobody, with scratch directories nobody can reach.
            FLEET_JOB_USER="nobody",
            FLEET_JOB_SCRATCH_DIR="/tmp/fleet-test-scratch",
        )
        log = self.logs / f"agent-{node}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "workers.agent", "--node", node, "--simulate", simulate],
                cwd=REPO, env=agent_env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        started = Proc(f"agent-{node}", proc, log)
        self.procs.append(started)
        return started

    def diagnostics(self) -> str:
        return "\n".join(f"--- {p.name} (rc={p.proc.poll()}):\n{p.output()}" for p in self.procs)


@pytest.fixture
def stack(
    live_server: Any, transactional_db: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Stack]:
    """A control worker on a queue of its own; the web side (live_server, this process)
    sends its schedule requests there too. Agents are started with stack.start_agent."""
    from fleet.services import messaging

    queue = f"control-e2e-{uuid.uuid4().hex[:8]}"
    monkeypatch.setattr(messaging, "CONTROL_QUEUE", queue)
    env = {
        k: v for k, v in os.environ.items() if k not in {"PYTEST_CURRENT_TEST", "PYTEST_ADDOPTS"}
    }
    env.update(
        DATABASE_URL=database_url(),
        REDIS_URL=settings.REDIS_URL,
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        DJANGO_SETTINGS_MODULE="fleet.settings",
        PYTHONUNBUFFERED="1",
    )
    running = Stack(control_queue=queue, env=env, logs=tmp_path, procs=[])
    running.spawn("control", [sys.executable, "-m", "tests.e2e.control_worker", queue])
    yield running
    for proc in reversed(running.procs):
        proc.stop()
    import redis

    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete(queue)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def new_page(browser: Any, live_server: Any) -> Iterator[Callable[[], Any]]:
    contexts: list[Any] = []

    def make() -> Any:
        context = browser.new_context(viewport={"width": 1366, "height": 900})
        context.set_default_timeout(20_000)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


def login(page: Any, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/login/")
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/fleet/")


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
