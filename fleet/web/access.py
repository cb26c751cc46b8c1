"""Who may open which dashboard page: the same rules as the API (fleet.services.access)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from fleet.services.access import can_use_fleet

View = Callable[..., HttpResponse]


def forbidden(request: HttpRequest, message: str) -> HttpResponse:
    return render(request, "web/forbidden.html", {"message": message}, status=403)


def member_required(view: View) -> View:
    """Anonymous visitors go to the login page; a user in no team is refused (403) with
    a sentence saying what to do; team members and staff get the page."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not can_use_fleet(request.user):
            return forbidden(
                request,
                "You are not a member of any team yet. Ask a team admin or a fleet admin "
                "to add you to one.",
            )
        return view(request, *args, **kwargs)

    return wrapper


def staff_required(view: View) -> View:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            return forbidden(request, "Only fleet staff may open this page.")
        return view(request, *args, **kwargs)

    return wrapper
