"""Fixtures of the fault suite: one private PostgreSQL and Redis per session, a template
database migrated and seeded once (a user, its token, two nodes and their keys), and per
test a fresh database cloned from it, a flushed Redis and a `Stack` to start."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.executions import ExecutionLog
from tests.faults.servers import PostgresServer, RedisServer, missing_tools
from tests.faults.stack import HEARTBEAT_TIMEOUT_S, PYTHON, REPO, Seed, Stack

TEMPLATE = "fleet_faults_template"
NODES = ("sim-a", "sim-b")
# The reaper and the scheduler tick every second (their rows are what beat reads).
FAST_BEAT = """
from django_celery_beat.models import IntervalSchedule, PeriodicTask
from scheduler.cycle.config import settings_update
settings_update(user=None, tick_seconds=1)
every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
assert PeriodicTask.objects.filter(task="fleet.tasks.reap_nodes").update(interval=every) == 1
"""


class Servers:
    def __init__(self, root: Path, pg: PostgresServer, redis: RedisServer, var_dir: Path) -> None:
        self.root = root
        self.pg = pg
        self.redis = redis
        self.var_dir = var_dir
        self.seed: Seed | None = None
        self.counter = itertools.count(1)


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def _seed(servers: Servers) -> Seed:
    """Migrate and seed the template database; every test's database is a copy."""
    servers.pg.create_database(TEMPLATE)
    stack = Stack(
        name="template",
        folder=servers.root,
        pg=servers.pg,
        redis=servers.redis,
        database=TEMPLATE,
        var_dir=servers.var_dir,
        seed=Seed("", "", {}),
        log=None,  # type: ignore[arg-type]
    )
    env = stack.control_env()
    _manage(env, "migrate", "--noinput", "-v0")
    _manage(env, "shell", "-c", FAST_BEAT)
    token = _manage(env, "add_user", "faults", "--team", "faults").strip().splitlines()[-1]
    keys = {}
    for node in NODES:
        out = _manage(env, "add_node", node, "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S))
        keys[node] = out.strip().splitlines()[-1]
    control = _manage(env, "control_key").strip().splitlines()[-1]
    return Seed(token=token, control_public_key=control, node_keys=keys)


@pytest.fixture(scope="session")
def fault_servers() -> Iterator[Servers]:
    missing = missing_tools()
    if missing:
        pytest.skip(
            f"the fault suite needs {', '.join(missing)} (PostgreSQL 15 server, redis-server)"
        )
    root = Path(tempfile.mkdtemp(prefix="fleet-faults-"))
    os.chmod(root, 0o755)
    pg = PostgresServer(root / "pg")
    redis = RedisServer(root / "redis")
    servers = Servers(root, pg, redis, root / "var")
    try:
        pg.init()
        pg.start()
        redis.start()
        servers.var_dir.mkdir(mode=0o700)
        servers.seed = _seed(servers)
        yield servers
    finally:
        redis.stop()
        pg.destroy()
        if not os.environ.get("FLEET_FAULTS_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def stack(
    fault_servers: Servers, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """A stack on a fresh copy of the template database and an empty Redis, not started:
    the test may set `env_overrides` first, then calls `stack.start()`."""
    servers = fault_servers
    assert servers.seed is not None
    if not servers.pg.running():
        servers.pg.start()
    database = f"fleet_faults_{next(servers.counter)}"
    servers.pg.create_database(database, template=TEMPLATE)
    servers.redis.flushall()
    exec_folder = Path(tempfile.mkdtemp(prefix="exec-", dir=servers.root))
    s = Stack(
        name=request.node.name,
        folder=tmp_path,
        pg=servers.pg,
        redis=servers.redis,
        database=database,
        var_dir=servers.var_dir,
        seed=servers.seed,
        log=ExecutionLog(exec_folder),
    )
    try:
        yield s
    finally:
        print("\n" + s.diagnostics())
        s.stop_all()
        shutil.copy(s.log.path, tmp_path / "executions.log")
        print(f"logs and executions.log: {tmp_path}")
        shutil.rmtree(exec_folder, ignore_errors=True)
        if not servers.pg.running():
            servers.pg.start()
        try:
            servers.pg.sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        except Exception as exc:  # the next test gets its own database anyway
            print(f"could not drop {database}: {exc}")
