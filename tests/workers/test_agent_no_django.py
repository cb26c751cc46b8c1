"""The agent needs the broker, never the database: importing it sets up no Django."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = """
import sys
import workers.agent, workers.tasks
loaded = sorted(m for m in sys.modules if m.startswith(("django", "fleet")))
# kombu's JSON encoder imports django.utils.functional when Django is installed (to encode
# lazy strings); nothing else of Django may load: no settings, no apps, no database.
allowed = {"django", "django.utils", "django.utils.functional", "django.utils.regex_helper",
           "django.utils.version"}
print(sorted(set(loaded) - allowed))
"""


@pytest.mark.parametrize("settings_module", [None, "fleet.settings"])
def test_importing_the_agent_loads_no_django_settings_models_or_fleet(
    settings_module: str | None,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    if settings_module:
        env["DJANGO_SETTINGS_MODULE"] = settings_module  # as on a host that has it set
    out = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "[]"
