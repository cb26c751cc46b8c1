"""/healthz: whether the database and Redis answer. No authentication."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse


def _database_ok() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return True, "ok"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"


def _redis_ok() -> tuple[bool, str]:
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL,
            socket_timeout=2,
            socket_connect_timeout=2,
            **getattr(settings, "REDIS_SSL_OPTIONS", {}),
        )
        client.ping()
        return True, "ok"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"


def healthz(request: HttpRequest) -> JsonResponse:
    db_ok, db_detail = _database_ok()
    redis_ok, redis_detail = _redis_ok()
    ok = db_ok and redis_ok
    return JsonResponse(
        {"status": "ok" if ok else "unhealthy", "database": db_detail, "redis": redis_detail},
        status=200 if ok else 503,
    )
