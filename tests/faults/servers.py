"""Private PostgreSQL and Redis servers for the fault suite, and a TCP proxy that can cut
a connection the way a network partition does.

The suite stops its PostgreSQL and flushes its Redis, so it never uses the servers other
tests share: both run from a temporary folder on free ports, and go away with it.
"""

from __future__ import annotations

import os
import pwd
import select
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path


def _pg_bin() -> Path:
    """FLEET_FAULTS_PG_BIN, else PostgreSQL 15's binaries, else the newest installed."""
    if os.environ.get("FLEET_FAULTS_PG_BIN"):
        return Path(os.environ["FLEET_FAULTS_PG_BIN"])
    preferred = Path("/usr/lib/postgresql/15/bin")
    if (preferred / "initdb").exists():
        return preferred
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else preferred


PG_BIN = _pg_bin()
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def missing_tools() -> list[str]:
    """What the suite needs from the host and does not find."""
    missing = [str(PG_BIN / t) for t in ("initdb", "pg_ctl") if not (PG_BIN / t).exists()]
    if not Path(REDIS_SERVER).exists():
        missing.append("redis-server")
    if not shutil.which("flock"):
        missing.append("flock")
    if os.geteuid() == 0 and not shutil.which("runuser"):
        missing.append("runuser")
    return missing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check, timeout: float, what: str, interval: float = 0.1):  # type: ignore[no-untyped-def]
    """Call `check` until it returns something truthy; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception as exc:  # the thing waited for is not up yet
            last_error = exc
            value = None
        if value:
            return value
        time.sleep(interval)
    detail = f" (last error: {last_error})" if last_error else ""
    raise TimeoutError(f"{what} did not happen within {timeout:g} s{detail}")


class PostgresServer:
    """A PostgreSQL cluster in `folder`, trust auth, on a unix socket in that folder and a
    TCP port on 127.0.0.1. Root cannot run initdb, so as root it runs as `postgres`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.socket_dir = folder / "run"
        self.port = free_port()
        self.log = folder / "postgres.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._as, *args], check=check, capture_output=True, text=True, timeout=120
        )

    def init(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if self._as:
            entry = pwd.getpwnam("postgres")
            for path in (self.folder, self.socket_dir):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "--no-sync", "-E", "UTF8", "--locale", "C.UTF-8",
        )  # fmt: skip
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.socket_dir}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "max_connections = 200\nshared_buffers = 64MB\n"
                # A client killed while its backend waits on a lock is noticed promptly.
                "client_connection_check_interval = 1000\n"
            )

    def start(self) -> None:
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
            "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        result = self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "status", check=False)
        return result.returncode == 0

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres", autocommit: bool = True):  # type: ignore[no-untyped-def]
        import psycopg

        return psycopg.connect(
            host=str(self.socket_dir), port=self.port, user="postgres", dbname=database,
            autocommit=autocommit, connect_timeout=5,
        )  # fmt: skip

    def sql(self, statement: str, database: str = "postgres") -> None:
        with self.connect(database) as conn:
            conn.execute(statement)  # type: ignore[arg-type]

    def create_database(self, name: str, template: str | None = None) -> None:
        self.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        extra = f' TEMPLATE "{template}"' if template else ""
        self.sql(f'CREATE DATABASE "{name}"{extra}')

    def destroy(self) -> None:
        if self.data.exists() and self.running():
            self.stop("immediate")


class RedisServer:
    """redis-server on a free port, nothing saved to disk."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "redis.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for(self.ping, 20, "redis-server answering")

    def client(self):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def ping(self) -> bool:
        return bool(self.client().ping())

    def url(self, port: int | None = None) -> str:
        return f"redis://127.0.0.1:{port or self.port}/0"

    def flushall(self) -> None:
        self.client().flushall()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class TcpProxy:
    """Relays 127.0.0.1:`port` to 127.0.0.1:`target`, and can be cut.

    `cut("blackhole")` is a partition: nothing is relayed any more in either direction
    and new connections are accepted but not connected through, so bytes wait in the
    kernel's buffers (then block their senders) as they would on a silent network;
    `heal()` relays what waited, as TCP delivers it once the network is back.
    `cut("reset")` closes every connection and refuses new ones until `heal()`.
    """

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self.mode = "open"
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._pairs: list[tuple[socket.socket, socket.socket | None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tcp-proxy", daemon=True)
        self._thread.start()

    def cut(self, mode: str = "blackhole") -> None:
        assert mode in ("blackhole", "reset")
        with self._lock:
            self.mode = mode
            if mode == "reset":
                for client, upstream in self._pairs:
                    for s in (client, upstream):
                        if s is not None:
                            _close_hard(s)
                self._pairs.clear()

    def heal(self) -> None:
        with self._lock:
            self.mode = "open"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            for client, upstream in self._pairs:
                for s in (client, upstream):
                    if s is not None:
                        s.close()
            self._pairs.clear()
        self._listener.close()

    def _connect(self, client: socket.socket) -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            _close_hard(client)
            return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                mode = self.mode
                # Connections accepted during a blackhole are connected through on heal.
                if mode == "open":
                    for i, (client, upstream) in enumerate(self._pairs):
                        if upstream is None:
                            up = self._connect(client)
                            self._pairs[i] = (client, up) if up else (client, None)
                    self._pairs = [(c, u) for c, u in self._pairs if u is not None]
                watched: list[socket.socket] = [self._listener]
                if mode == "open":
                    for client, upstream in self._pairs:
                        watched += [client, upstream]  # type: ignore[list-item]
            try:
                readable, _, _ = select.select(watched, [], [], 0.05)
            except (OSError, ValueError):
                self._drop_closed()
                continue
            for s in readable:
                if s is self._listener:
                    client, _ = self._listener.accept()
                    with self._lock:
                        if self.mode == "reset":
                            _close_hard(client)
                        elif self.mode == "blackhole":
                            self._pairs.append((client, None))
                        else:
                            up = self._connect(client)
                            if up is not None:
                                self._pairs.append((client, up))
                    continue
                self._relay(s)

    def _relay(self, s: socket.socket) -> None:
        with self._lock:
            if self.mode != "open":
                return
            pair = next((p for p in self._pairs if s in p), None)
            if pair is None:
                return
            other = pair[1] if s is pair[0] else pair[0]
            try:
                data = s.recv(65536)
                if data and other is not None:
                    other.sendall(data)
                    return
            except OSError:
                pass
            for x in pair:
                if x is not None:
                    x.close()
            self._pairs.remove(pair)

    def _drop_closed(self) -> None:
        with self._lock:
            self._pairs = [
                (c, u)
                for c, u in self._pairs
                if c.fileno() != -1 and (u is None or u.fileno() != -1)
            ]


def _close_hard(s: socket.socket) -> None:
    """Close with a reset rather than a clean FIN, as a dropped route would."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass
    s.close()
