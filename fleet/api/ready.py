"""/readyz: whether fleet can do its work, not only whether it is alive (that is /healthz,
which stays cheap). No authentication; it names no secret.

Ready means: the database and Redis answer, a control worker answers a ping, beat is
ticking (the reaper, which beat sends every few seconds, ran recently: a dead beat or a
dead control worker both stop it, and the ping tells them apart), and at least one agent's
node is up. Each check says what it saw; any failure makes the answer 503.
"""

from __future__ import annotations

import time

from django.core.cache import cache
from django.http import HttpRequest, JsonResponse

from fleet.api.health import _database_ok, _redis_ok
from fleet.models import Node, NodeState

REAPER_RAN_KEY = "ready:reaper-ran"
# The reaper runs every 10 s by default; three missed ticks mean beat is not ticking.
BEAT_STALE_S = 45.0
PING_TIMEOUT_S = 1.0


def reaper_ran(now: float | None = None) -> None:
    """Called by the reaper task each time beat has it run."""
    try:
        cache.set(REAPER_RAN_KEY, time.time() if now is None else now, timeout=None)
    except Exception:
        pass  # Redis down: /readyz says so on its own


def _control_worker() -> tuple[bool, str]:
    from fleet.celery import app

    try:
        replies = app.control.ping(timeout=PING_TIMEOUT_S) or []
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    names = sorted(name for reply in replies for name in reply if name.startswith("control@"))
    if not names:
        return False, "no control worker answered a ping"
    return True, f"{len(names)} answering"


def _beat(now: float) -> tuple[bool, str]:
    try:
        ran = cache.get(REAPER_RAN_KEY)
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if ran is None:
        return False, "the reaper has never run: is beat running?"
    age = now - float(ran)
    if age > BEAT_STALE_S:
        return False, f"the reaper last ran {age:.0f} s ago: is beat running?"
    return True, f"reaper ran {age:.0f} s ago"


def _agents() -> tuple[bool, str]:
    try:
        up = Node.objects.filter(state__in=[NodeState.UP, NodeState.DRAINING]).count()
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return (up > 0, f"{up} node(s) up" if up else "no agent has registered a node that is up")


def readyz(request: HttpRequest) -> JsonResponse:
    checks = {
        "database": _database_ok(),
        "redis": _redis_ok(),
        "control_worker": _control_worker(),
        "beat": _beat(time.time()),
        "agents": _agents(),
    }
    ok = all(passed for passed, _ in checks.values())
    body: dict[str, str] = {"status": "ready" if ok else "not ready"}
    body.update({name: detail for name, (_, detail) in checks.items()})
    return JsonResponse(body, status=200 if ok else 503)
