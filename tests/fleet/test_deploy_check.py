"""`manage.py check --deploy` is clean with the production settings docker-compose.yml gives
the web service."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import yaml

from workers.wire import key_generate

REPO = Path(__file__).resolve().parents[2]


def _compose_web_env() -> dict[str, str]:
    """The web service's environment in docker-compose.yml, ${VAR:-default} resolved to its
    default and ${VAR:?...} (required, like SECRET_KEY) to a value an operator would give."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env = compose["services"]["web"]["environment"]
    given = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "REDIS_PASSWORD": secrets.token_hex(32),
        "FLEET_CONTROL_KEY": key_generate(),
    }

    def resolve(value: str) -> str:
        def one(match: re.Match[str]) -> str:
            name, op, rest = match.group(1), match.group(2), match.group(3)
            if op == ":-":
                return os.environ.get(name) or rest
            return given[name]

        return re.sub(r"\$\{(\w+)(:-|:\?)([^}]*)\}", one, value)

    return {key: resolve(str(value)) for key, value in env.items()}


def test_the_compose_settings_pass_the_deploy_checks(tmp_path: Path) -> None:
    compose_env = _compose_web_env()
    assert compose_env["DEBUG"] == "0"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "FLEET_"))
    }
    env.update(compose_env, DJANGO_SETTINGS_MODULE="fleet.settings", FLEET_VAR_DIR=str(tmp_path))
    # The CA file the compose file mounts must exist (fleet refuses a missing one); the
    # check never connects to Redis, so any file stands in for it.
    assert env["REDIS_URL"].startswith("rediss://")
    ca = tmp_path / "redis-ca.crt"
    ca.write_text("")
    env["FLEET_REDIS_CA_FILE"] = str(ca)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO", "SECRET_KEY", "DEBUG", "FLEET_"))
    }
    env.update(DJANGO_SETTINGS_MODULE="fleet.settings", FLEET_VAR_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "SECRET_KEY must be set in production" in result.stderr
    assert not (tmp_path / "secret_key").exists()
