"""Login lockouts: the authentication backend and the page a locked-out login gets."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_client_username
from django.conf import settings
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone


class LockoutBackend(AxesStandaloneBackend):
    """Refuses a login form's attempt while its user name and address are locked out.

    Lockouts guard requests; an authenticate() call with no request comes from code
    (a management command, a test client's login), which has nothing to lock out.
    """

    def authenticate(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        if request is None:
            return None
        return super().authenticate(request, *args, **kwargs)


def lockout_response(request: Any, original_response: Any, credentials: Any) -> HttpResponse:
    """The page a locked-out login form gets (429), saying when to try again."""
    cool_off: timedelta | None = settings.AXES_COOLOFF_TIME
    until = timezone.now() + cool_off if cool_off else None
    context = {
        "username": get_client_username(request, credentials) or "",
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "minutes": round(cool_off.total_seconds() / 60) if cool_off else None,
        "until": until,
    }
    return render(request, "login_locked.html", context, status=429)
