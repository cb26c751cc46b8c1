"""A whole fleet stack as real processes, on the suite's private PostgreSQL and Redis:
web (runserver), control worker, beat and simulated agents, each a subprocess with its
own log, and the means to hurt them (kill -9, SIGSTOP, restart, partition).

Timings are short (heartbeat 0.5 s, node timeout 3 s, lease 6 s, grace 1 s, start
timeout 5 s) so a fault plays out in seconds. Every process of a test, and every job
process its agents started, is killed when the test ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.executions import Execution, ExecutionLog
from tests.faults.invariants import TERMINAL, Report, Violation, check, invariants_hold, timestamp
from tests.faults.servers import PostgresServer, RedisServer, TcpProxy, free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PYTHON = sys.executable

# What `make up` runs the control worker and beat under, when it exists: it starts them
# again whenever they exit (a database or broker outage). Agents run bare, so an agent
# killed in a test stays down until the test starts it again.
SUPERVISE = REPO / "scripts" / "supervise.sh"

HEARTBEAT_TIMEOUT_S = 3
# Every process gets these (a process that does not know a setting ignores it).
TIMINGS = {
    "FLEET_HEARTBEAT_INTERVAL": "0.5",
    "FLEET_TELEMETRY_INTERVAL": "2",
    "FLEET_SUPERVISE_INTERVAL": "0.2",
    "FLEET_JOB_GRACE": "1",
    "FLEET_START_TIMEOUT": "5",
    "FLEET_MISSING_GRACE": "3",
    "FLEET_LEASE_S": "6",
    "FLEET_LEASE_MARGIN_S": "2",
}
# When the control side may declare a silent node's jobs lost at the earliest.
LOST_AFTER_S = HEARTBEAT_TIMEOUT_S + 6 + 1 + 2
# Beyond a timeout, what the control side may take to act on it (reaper and scheduler
# ticks, a message in the queue) before a job counts as stuck.
STUCK_SLACK_S = 5.0
# What the fault suite keeps out of the processes it starts: the caller's stack settings.
_DROP = ("DATABASE_URL", "REDIS_URL", "CELERY_", "FLEET_", "DJANGO_SETTINGS_MODULE", "SECRET_KEY")


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP)}
    env.update({"PYTHONUNBUFFERED": "1", "LOG_LEVEL": "INFO"})
    return env


@dataclass
class Proc:
    """One process of the stack. `group` signals reach its whole process group (a Celery
    worker's pool children); an agent is signalled alone, as its jobs live in their own
    sessions anyway."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    group: bool = True
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> Proc:
        assert not self.alive(), f"{self.name} is already running"
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        log.write(
            f"\n==== start {self.starts} at {time.time():.2f}: {' '.join(self.argv)}\n".encode()
        )
        log.flush()
        self.popen = subprocess.Popen(
            self.argv, env=self.env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def signal(self, sig: int) -> None:
        if self.popen is None:
            return
        try:
            if self.group:
                os.killpg(self.popen.pid, sig)
            else:
                os.kill(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill9(self) -> None:
        """kill -9: no cleanup, no goodbye."""
        self.signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(timeout=10)

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def terminate(self, timeout: float = 20) -> None:
        """A graceful stop (SIGTERM), then SIGKILL if it takes longer than `timeout`."""
        if not self.alive():
            return
        self.signal(signal.SIGTERM)
        try:
            assert self.popen is not None
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()

    def cleanup(self) -> None:
        if self.popen is None:
            return
        self.signal(signal.SIGCONT)
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-lines:])


@dataclass
class Seed:
    """What the template database holds: one user and token, two nodes and their keys."""

    token: str
    control_public_key: str
    node_keys: dict[str, str]


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.token = token

    def call(self, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise AssertionError(
                f"{method} {path} -> {exc.code}: {exc.read().decode(errors='replace')[:500]}"
            ) from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, body if body is not None else {})


@dataclass
class Stack:
    name: str
    folder: Path
    pg: PostgresServer
    redis: RedisServer
    database: str
    var_dir: Path
    seed: Seed
    log: ExecutionLog
    env_overrides: dict[str, str] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    proxies: dict[str, TcpProxy] = field(default_factory=dict)
    submitted: list[int] = field(default_factory=list)
    web_port: int = 0
    api: Api | None = None

    # -- environments -----------------------------------------------------------------------

    def control_env(self) -> dict[str, str]:
        env = _base_env()
        env.update(TIMINGS)
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "fleet.settings",
                "DEBUG": "1",
                "DATABASE_URL": self.pg.url(self.database),
                "REDIS_URL": self.redis.url(),
                "FLEET_VAR_DIR": str(self.var_dir),
                "DATABASE_CONN_MAX_AGE": "60",
            }
        )
        env.update(self.env_overrides)
        return env

    def agent_env(self, node: str, redis_port: int | None = None) -> dict[str, str]:
        env = _base_env()
        env.update(TIMINGS)
        env.update(
            {
                "REDIS_URL": self.redis.url(redis_port),
                "FLEET_NODE_KEY": self.seed.node_keys[node],
                "FLEET_CONTROL_PUBLIC_KEY": self.seed.control_public_key,
                "FLEET_AGENT_STATE_DIR": str(self.folder / "agents" / node),
                "FAULTS_NODE": node,
                "FLEET_JOB_ENV_ALLOW": "FAULTS_NODE",
            }
        )
        if os.geteuid() == 0:
            env["FLEET_JOB_USER"] = "nobody"
        env.update(self.env_overrides)
        return env

    # -- processes --------------------------------------------------------------------------

    def _proc(self, name: str, argv: list[str], env: dict[str, str], group: bool = True) -> Proc:
        (self.folder / "logs").mkdir(exist_ok=True)
        proc = Proc(name, argv, env, self.folder / "logs" / f"{name}.log", group=group)
        self.procs[name] = proc
        return proc

    @property
    def web(self) -> Proc:
        return self.procs["web"]

    @property
    def control(self) -> Proc:
        return self.procs["control"]

    @property
    def beat(self) -> Proc:
        return self.procs["beat"]

    def agent(self, node: str) -> Proc:
        return self.procs[f"agent-{node}"]

    def start(
        self,
        *,
        nodes: Iterable[str] = ("sim-a", "sim-b"),
        proxied: Iterable[str] = (),
        simulate: str = "2xA100-80GB",
    ) -> None:
        self.web_port = free_port()
        env = self.control_env()
        self._proc(
            "web",
            [PYTHON, "manage.py", "runserver", f"127.0.0.1:{self.web_port}", "--noreload"],
            env,
        ).start()
        supervised = ["bash", str(SUPERVISE)] if SUPERVISE.exists() else []
        self._proc(
            "control",
            [*supervised, str(BIN / "celery"), "-A", "fleet", "worker", "-Q", "control",
             "-n", "control@%h", "--concurrency", "2", "--loglevel", "INFO"],
            env,
        ).start()  # fmt: skip
        self._proc(
            "beat",
            [*supervised, str(BIN / "celery"), "-A", "fleet", "beat", "--loglevel", "INFO",
             "-s", str(self.folder / "beat-schedule")],
            env,
        ).start()  # fmt: skip
        proxied = set(proxied)
        for node in nodes:
            port = None
            if node in proxied:
                self.proxies[node] = TcpProxy(self.redis.port)
                port = self.proxies[node].port
            self._proc(
                f"agent-{node}",
                [PYTHON, "-m", "workers.agent", "--node", node, "--simulate", simulate],
                self.agent_env(node, port),
                group=False,
            ).start()
        self.api = Api(f"http://127.0.0.1:{self.web_port}", self.seed.token)
        wait_for(self._web_ready, 60, "the web server answering /healthz", 0.3)
        wait_for(lambda: self.nodes_up(set(nodes)), 60, f"nodes {sorted(nodes)} up", 0.3)
        wait_for(lambda: "Sending due task" in self.beat.output(), 30, "beat sending ticks", 0.3)

    def _web_ready(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/healthz", timeout=5) as r:
            return r.status == 200

    def nodes_up(self, names: set[str]) -> bool:
        nodes = self.nodes()
        return all(nodes.get(n, {}).get("state") == "up" for n in names)

    def restart(self, name: str) -> Proc:
        proc = self.procs[name]
        if proc.alive():
            proc.kill9()
        return proc.start()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.cleanup()
        for proxy in self.proxies.values():
            proxy.close()
        self.kill_strays()

    def kill_strays(self) -> None:
        """SIGKILL the job processes and shims this test's agents left (identified by this
        test's folders in their command lines)."""
        marks = (str(self.log.folder).encode(), str(self.folder).encode())
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if any(mark in cmdline for mark in marks):
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    # -- the API ----------------------------------------------------------------------------

    def submit(self, count: int, seconds: int, **fields: Any) -> list[int]:
        ids = []
        for i in range(count):
            body = {
                "name": f"fault-{len(self.submitted) + 1}",
                "command": self.log.command(seconds),
                "gpus": 1,
                "time_limit": 600,
                "workdir": str(self.log.folder),
                "max_requeues": 20,
                **fields,
            }
            assert self.api is not None
            ids.append(int(self.api.post("/api/v1/jobs/", body)["id"]))
            self.submitted.append(ids[-1])
            del i
        return ids

    def jobs(self) -> dict[int, dict[str, Any]]:
        assert self.api is not None
        out: dict[int, dict[str, Any]] = {}
        page = 1
        while True:
            data = self.api.get(f"/api/v1/jobs/?page_size=200&page={page}&ordering=id")
            rows = data["results"] if isinstance(data, dict) else data
            out.update({int(row["id"]): row for row in rows})
            if not isinstance(data, dict) or not data.get("next"):
                return out
            page += 1

    def events(self, job_id: int) -> list[dict[str, Any]]:
        assert self.api is not None
        data = self.api.get(f"/api/v1/jobs/{job_id}/events/?page_size=500")
        return list(data["results"] if isinstance(data, dict) else data)

    def cancel(self, job_id: int) -> dict[str, Any]:
        assert self.api is not None
        return dict(self.api.post(f"/api/v1/jobs/{job_id}/cancel/"))

    def logs(self, job_id: int, *, rank: int = 0, attempt: int | None = None) -> str:
        """A member's stored output of one attempt (default: the latest), read to its end."""
        assert self.api is not None
        out, offset = [], 0
        while True:
            query = f"offset={offset}&rank={rank}" + (f"&attempt={attempt}" if attempt else "")
            page = self.api.get(f"/api/v1/jobs/{job_id}/logs/?{query}")
            out.append(page["data"])
            if page["next_offset"] == offset:
                return "".join(out)
            offset = page["next_offset"]

    def send_report(self, node: str, **report: Any) -> None:
        """Send one job report signed with `node`'s key, as its agent would (a duplicated or
        late message), from a process of its own with the agent's environment."""
        code = (
            "import json, sys\n"
            "from workers.agent import node_key, parse_args\n"
            "from workers.celery_app import configure, control_queue\n"
            "from workers.runtime import REPORT_TASK\n"
            "from workers.wire import DEFAULT_TTL_S, Signer\n"
            "args = parse_args(['--node', sys.argv[1]])\n"
            "app = configure(args.node)\n"
            "envelope = Signer(node_key(args)).seal(\n"
            "    REPORT_TASK, args.node, json.loads(sys.argv[2]), DEFAULT_TTL_S)\n"
            "app.send_task(REPORT_TASK, kwargs=envelope, queue=control_queue())\n"
            "app.close()\n"
        )
        result = subprocess.run(
            [PYTHON, "-c", code, node, json.dumps(report)], cwd=REPO, env=self.agent_env(node),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, f"sending a report as {node} failed: {result.stderr}"

    def place_by_hand(self, job_id: int, *members: tuple[str, tuple[int, ...]]) -> bool:
        """Dispatch a pending job to these (node, GPU indices) members, rank 0 first, through
        the production apply step (scheduler.cycle.apply) under the cycle lock, as a policy
        that placed it would. False when the job was not placed (it moved meanwhile)."""
        code = (
            "import json, os, time\n"
            "from scheduler.core.model import Member, Place, Plan\n"
            "from scheduler.cycle.apply import apply_plan\n"
            "from scheduler.cycle.lock import cycle_lock\n"
            "from scheduler.cycle.snapshot import build_snapshot\n"
            "job, rows = json.loads(os.environ['FAULTS_PLACE'])\n"
            "(first, gpus), *rest = rows\n"
            "place = Place(job, first, tuple(gpus),\n"
            "              members=tuple(Member(n, tuple(g)) for n, g in rest))\n"
            "for _ in range(100):  # a scheduling cycle may hold the lock a moment\n"
            "    with cycle_lock() as held:\n"
            "        if held:\n"
            "            out = apply_plan(build_snapshot(), Plan('by-hand', places=(place,)))\n"
            "            break\n"
            "    time.sleep(0.1)\n"
            "else:\n"
            "    raise SystemExit('the cycle lock stayed held')\n"
            "print('PLACED' if out.placed == [job] else f'SKIPPED {out.skipped}')\n"
        )
        env = self.control_env()
        env["FAULTS_PLACE"] = json.dumps([job_id, [[n, list(g)] for n, g in members]])
        result = subprocess.run(
            [PYTHON, "manage.py", "shell", "-c", code], cwd=REPO, env=env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, f"placing job {job_id} by hand failed: {result.stderr}"
        return "PLACED" in result.stdout

    def nodes(self) -> dict[str, dict[str, Any]]:
        assert self.api is not None
        data = self.api.get("/api/v1/nodes/")
        rows = data["results"] if isinstance(data, dict) else data
        return {row["name"]: row for row in rows}

    # -- waiting on what ran ------------------------------------------------------------------

    def executions(self) -> list[Execution]:
        return self.log.read()

    def wait_executions(
        self, count: int, *, node: str | None = None, live: bool = True, timeout: float = 30
    ) -> list[Execution]:
        """Wait until at least `count` executions (on `node`, still running when `live`)
        are in the log."""

        def enough() -> list[Execution] | None:
            runs = [
                r
                for r in self.executions()
                if (node is None or r.node == node) and (not live or r.alive)
            ]
            return runs if len(runs) >= count else None

        what = f"{count} {'live ' if live else ''}executions" + (f" on {node}" if node else "")
        return list(wait_for(enough, timeout, what, 0.2))

    def wait_jobs(self, predicate: Any, timeout: float, what: str) -> dict[int, dict[str, Any]]:
        def ready() -> dict[int, dict[str, Any]] | None:
            jobs = self.jobs()
            return jobs if predicate(jobs) else None

        return dict(wait_for(ready, timeout, what, 0.3))

    def settle(self, timeout: float = 90) -> list[Violation]:
        """Wait until every job is finished and no execution runs any more; give up after
        `timeout` seconds (the check then names what is stuck). Meanwhile, watch for jobs
        stuck longer than their timeouts: assigned without a start past the start timeout
        (or past the time a down node's jobs are declared lost), running in the database
        with no process running it for longer than the control side needs to notice."""
        start_timeout = float(self.control_env()["FLEET_START_TIMEOUT"])
        assigned_limit = max(start_timeout, LOST_AFTER_S) + STUCK_SLACK_S
        running_limit = LOST_AFTER_S + float(TIMINGS["FLEET_MISSING_GRACE"]) + STUCK_SLACK_S
        unrun_since: dict[tuple[int, int], float] = {}
        stuck: dict[tuple[str, int], Violation] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                jobs = self.jobs()
            except Exception:
                time.sleep(1)
                continue
            runs = self.executions()
            now = time.time()
            for job_id, job in jobs.items():
                if job["state"] == "assigned" and job.get("assigned_at"):
                    waited = now - (timestamp(job["assigned_at"]) or now)
                    if waited > assigned_limit:
                        stuck[("stuck-assigned", job_id)] = Violation(
                            "stuck-assigned",
                            job_id,
                            f"assigned to {job.get('node')} (attempt {job['attempt']}) for "
                            f"{waited:.0f} s without starting (limit {assigned_limit:g} s)",
                        )
                key = (job_id, int(job["attempt"]))
                running = job["state"] == "running" and not any(
                    r.alive and r.job_id == job_id and r.attempt == key[1] for r in runs
                )
                if not running:
                    unrun_since.pop(key, None)
                    continue
                since = unrun_since.setdefault(key, now)
                if now - since > running_limit:
                    stuck[("stuck-running", job_id)] = Violation(
                        "stuck-running",
                        job_id,
                        f"running on {job.get('node')} (attempt {key[1]}) in the database with "
                        f"no process running it for {now - since:.0f} s "
                        f"(limit {running_limit:g} s)",
                    )
            if all(j["state"] in TERMINAL for j in jobs.values()) and not any(
                r.alive for r in runs
            ):
                break
            time.sleep(0.5)
        return list(stuck.values())

    def report(
        self,
        fault: str,
        *,
        settle_s: float = 90,
        allow_rerun_after_completion: bool = False,
        expect_states: Mapping[int, str] | None = None,
    ) -> Report:
        stuck = self.settle(settle_s)
        jobs = self.jobs()
        events = {job_id: self.events(job_id) for job_id in jobs}
        executions = self.executions()
        # The database's side of the story, kept beside the execution log for a post-mortem
        # (the test's database is dropped when it ends).
        (self.folder / "jobs.json").write_text(
            json.dumps({"jobs": jobs, "events": events}, indent=1, default=str)
        )
        violations = check(
            executions=executions,
            jobs=jobs,
            events=events,
            now=time.time(),
            allow_rerun_after_completion=allow_rerun_after_completion,
            expect_states=expect_states,
        )
        return Report(fault, jobs, executions, stuck + violations)

    def assert_invariants(self, fault: str, **options: Any) -> Report:
        report = self.report(fault, **options)
        print(report.text())
        (self.folder / "report.txt").write_text(report.text() + "\n")
        summary = os.environ.get("FLEET_FAULTS_SUMMARY")
        if summary:  # one line per fault, for the table
            with open(summary, "a") as fh:
                fh.write(f"{self.name}: {report.summary()}\n")
        invariants_hold(report)
        return report

    def all_succeed(self, ids: Iterable[int] | None = None) -> dict[int, str]:
        return {i: "succeeded" for i in (ids if ids is not None else self.submitted)}

    def diagnostics(self) -> str:
        parts = []
        for proc in self.procs.values():
            state = "running" if proc.alive() else f"exited {proc.returncode()}"
            parts.append(f"--- {proc.name} ({state}), {proc.log_path}\n{proc.tail(15)}")
        return "\n".join(parts)
