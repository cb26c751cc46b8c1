"""Run the installed `fleetctl` as a subprocess against pytest-django's live server (real
PostgreSQL; the server thread sees committed rows, hence transactional tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

FLEETCTL = Path(sys.executable).with_name("fleetctl")


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def fleetctl(live_server: Any, tmp_path: Path) -> Any:
    """fleetctl(*args, token=..., url=..., stdin=...) -> Result (url="" sets no FLEET_URL);
    FLEET_CONFIG points into the test's temporary folder, so no user's config is read or written."""
    assert FLEETCTL.exists(), f"{FLEETCTL} is missing: pip install -e . installs the script"

    def run(*args: str, token: str | None = None, url: str | None = None,
            stdin: str = "") -> Result:  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        env["FLEET_CONFIG"] = str(tmp_path / "fleet" / "config")
        if url != "":  # "" leaves FLEET_URL unset
            env["FLEET_URL"] = url or live_server.url
        if token:
            env["FLEET_TOKEN"] = token
        proc = subprocess.run(
            [str(FLEETCTL), *args], env=env, input=stdin, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def tokens(owner: Any, teammate: Any, outsider: Any, staff: Any) -> dict[str, str]:
    from fleet.services.tokens import token_rotate

    return {u.username: token_rotate(user=u) for u in (owner, teammate, outsider, staff)}
