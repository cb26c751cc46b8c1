"""Helpers for live partials: a short shared cache of rendered fragments, so a hundred
open dashboards cost about one render per half second rather than one each."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

POLL_SECONDS = 2


def bucket_seconds() -> float:
    """How long one rendered fragment is shared; 0 turns sharing off (tests do that)."""
    return float(getattr(settings, "FLEET_WEB_LIVE_CACHE_SECONDS", 0.5))


def shared_fragment(key: str, render: Callable[[], str]) -> str:
    """Render once per time bucket and share the HTML among all viewers of the same key.
    A cache outage only costs a render."""
    width = bucket_seconds()
    if width <= 0:
        return render()
    full_key = f"web:frag:{key}:{int(time.time() / width)}"
    try:
        html = cache.get(full_key)
    except Exception:
        return render()
    if html is None:
        html = render()
        try:
            cache.set(full_key, html, timeout=max(2, int(width * 4)))
        except Exception:
            pass
    return html


def is_partial(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true" or request.GET.get("partial") == "1"
