"""Redis with a password and TLS works end to end: a real redis-server that speaks only TLS
and asks for a password, certificates made by scripts/make-redis-certs.sh, and fleet's own
configuration code (fleet/settings.py for the cache and the control side's Celery,
workers/celery_app.py for the agent). Clients without the password, without TLS, or that do
not trust the CA are refused."""

from __future__ import annotations

import runpy
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from django.core.cache import caches
from django.test import override_settings

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret-broker-password"

pytestmark = pytest.mark.skipif(
    not (shutil.which("redis-server") and shutil.which("openssl")),
    reason="needs redis-server (built with TLS) and openssl",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _certs(folder: Path, *names: str) -> Path:
    subprocess.run(
        [str(ROOT / "scripts" / "make-redis-certs.sh"), str(folder), *names],
        check=True,
        capture_output=True,
    )
    return folder


class TlsRedis(SimpleNamespace):
    port: int
    ca: Path
    other_ca: Path

    def url(self, *, scheme: str = "rediss", password: str | None = PASSWORD) -> str:
        auth = f":{password}@" if password else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    tls = _certs(tmp_path_factory.mktemp("tls"))
    other = _certs(tmp_path_factory.mktemp("other-ca"))
    port = _free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port),
         "--tls-cert-file", str(tls / "redis.crt"), "--tls-key-file", str(tls / "redis.key"),
         "--tls-ca-cert-file", str(tls / "ca.crt"), "--tls-auth-clients", "no",
         "--requirepass", PASSWORD, "--save", "", "--appendonly", "no",
         "--dir", str(tls)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    found = TlsRedis(port=port, ca=tls / "ca.crt", other_ca=other / "ca.crt")
    client = redis.Redis.from_url(found.url(), ssl_ca_certs=str(found.ca), socket_timeout=2)
    deadline = time.monotonic() + 15
    while True:  # wait for the server to listen (it starts in well under a second)
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                out = server.stdout.read().decode() if server.stdout else ""
                pytest.fail(f"redis-server with TLS did not start:\n{out}")
            time.sleep(0.05)
    client.close()
    yield found
    server.terminate()
    server.wait(timeout=10)


def _settings(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> dict[str, Any]:
    """fleet/settings.py evaluated afresh with `env`: what a control process would use."""
    monkeypatch.setenv("SECRET_KEY", "broker-tls-test-" + "x" * 40)
    monkeypatch.setenv("DEBUG", "1")
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(ROOT / "fleet" / "settings.py"))


def _agent_app(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], node: str) -> Celery:
    """workers/celery_app.py evaluated afresh with `env`: the agent's own configuration."""
    for name in ("CELERY_BROKER_URL", "FLEET_REDIS_CERT_REQS", "FLEET_REDIS_CA_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    module = runpy.run_path(str(ROOT / "workers" / "celery_app.py"))
    app: Celery = module["configure"](node)
    return app


def test_the_django_cache_works_through_tls_with_a_password(
    tls_redis: TlsRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = _settings(
        monkeypatch, {"REDIS_URL": tls_redis.url(), "FLEET_REDIS_CA_FILE": str(tls_redis.ca)}
    )
    assert conf["CACHES"]["default"]["OPTIONS"]["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    with override_settings(CACHES=conf["CACHES"]):
        cache = caches["default"]
        cache.set("broker-tls-probe", {"ok": 1}, timeout=30)
        assert cache.get("broker-tls-probe") == {"ok": 1}
        # The telemetry buffer uses the cache's own client for list operations.
        client = cache._cache.get_client(write=True)  # type: ignore[attr-defined]
        assert client.connection_pool.connection_class is redis.SSLConnection


def test_a_task_sent_by_the_control_side_reaches_the_agent_through_tls(
    tls_redis: TlsRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"REDIS_URL": tls_redis.url(), "FLEET_REDIS_CA_FILE": str(tls_redis.ca)}
    conf = _settings(monkeypatch, env)
    control = Celery("control-tls-test", set_as_current=False)
    # As fleet/celery.py does: the CELERY_* settings, nothing else.
    control.config_from_object(SimpleNamespace(**conf), namespace="CELERY")
    agent = _agent_app(monkeypatch, env, "tls-node")
    assert agent.conf.broker_use_ssl["ssl_cert_reqs"] == ssl.CERT_REQUIRED

    with agent.connection_for_read() as conn:  # the agent's queue exists once it runs
        queue = agent.amqp.queues["node.tls-node"](conn.default_channel)
        queue.declare()
        queue.purge()
    control.send_task("workers.tasks.ping", kwargs={"n": 7}, queue="node.tls-node")
    with agent.connection_for_read() as conn:
        message = agent.amqp.queues["node.tls-node"](conn.default_channel).get(no_ack=True)
    assert message is not None
    assert message.headers["task"] == "workers.tasks.ping"
    assert message.decode()[1] == {"n": 7}


def test_clients_without_the_password_or_tls_or_trust_are_refused(
    tls_redis: TlsRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = {"ssl_ca_certs": str(tls_redis.ca), "socket_timeout": 2}
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(tls_redis.url(password=None), **ca).ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(tls_redis.url(password="wrong"), **ca).ping()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(tls_redis.url(scheme="redis"), socket_timeout=2).ping()
    # The certificate is checked by default: a client trusting another CA is refused, by
    # the cache settings and by the agent's broker settings alike.
    env = {"REDIS_URL": tls_redis.url(), "FLEET_REDIS_CA_FILE": str(tls_redis.other_ca)}
    conf = _settings(monkeypatch, env)
    options = conf["CACHES"]["default"]["OPTIONS"]
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        redis.Redis.from_url(tls_redis.url(), socket_timeout=2, **options).ping()
    agent = _agent_app(monkeypatch, env, "tls-node")
    with pytest.raises(Exception, match="certificate verify failed"):
        with agent.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
            conn.default_channel.client.ping()


def test_a_bad_tls_setting_is_refused_with_a_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.broker import BrokerConfigError, redis_ssl_options

    url = "rediss://:pw@redis:6380/0"
    assert redis_ssl_options("redis://:pw@redis:6379/0", {"FLEET_REDIS_CA_FILE": "/x"}) == {}
    with pytest.raises(BrokerConfigError, match="FLEET_REDIS_CERT_REQS must be one of"):
        redis_ssl_options(url, {"FLEET_REDIS_CERT_REQS": "maybe"})
    with pytest.raises(BrokerConfigError, match="FLEET_REDIS_CA_FILE=/nonexistent: no such"):
        redis_ssl_options(url, {"FLEET_REDIS_CA_FILE": "/nonexistent"})
    relaxed = redis_ssl_options(url, {"FLEET_REDIS_CERT_REQS": "none"})
    assert relaxed == {"ssl_cert_reqs": ssl.CERT_NONE, "ssl_check_hostname": False}
