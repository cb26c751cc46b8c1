"""Error responses: one JSON shape under /api/, and no debug page for non-staff.

Errors that DRF's exception handler sees already have the shape. This middleware, right
inside SecurityMiddleware, catches the rest: a URL that matches no route (/api/v1/jobs/abc/), a body over
DATA_UPLOAD_MAX_MEMORY_SIZE, a 500 from anywhere. Under /api/ each leaves as
`{"message": ..., "extra": {...}}`; elsewhere the HTML error pages stay, but in development
mode a non-staff visitor gets the plain 404 page instead of Django's technical one (the
technical 500 page is kept for staff by fleet.debug.StaffOnlyExceptionReporter).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import is_valid_path
from django.views.defaults import page_not_found

from fleet.debug import is_staff_request

API_PREFIX = "/api/"
# Headers of the original response that a client still needs on the JSON one.
KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate", "Location")


def error_json(status: int, message: str, extra: dict[str, Any] | None = None) -> JsonResponse:
    return JsonResponse({"message": message, "extra": extra or {}}, status=status)


def _too_big(request: HttpRequest) -> JsonResponse | None:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    if limit is None or length <= limit:
        return None
    return _too_big_response(length)


def _too_big_response(length: int | None) -> JsonResponse:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    size = f"{length} bytes" if length else "too large"
    return error_json(
        413,
        f"The request body is {size}; fleet accepts at most {limit} bytes.",
        {"limit_bytes": limit},
    )


def _message_for(request: HttpRequest, status: int) -> tuple[str, dict[str, Any]]:
    path = request.path
    if status == 404:
        slashed = f"{request.path_info}/"
        if not path.endswith("/") and is_valid_path(slashed, getattr(request, "urlconf", None)):
            return f"Nothing at {path}; did you mean {path}/?", {"path": path}
        return f"Nothing at {path}: no such endpoint or object.", {"path": path}
    if status == 405:
        return f"{request.method} is not allowed on {path}.", {"path": path}
    if status >= 500:
        return "Server error. It has been logged; if it persists, tell an admin.", {}
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    return f"{phrase}.", {}


def _as_api_error(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if response.status_code < 400:
        return response
    data = getattr(response, "data", None)  # a DRF response, rendered by a non-JSON renderer
    if isinstance(data, dict) and "message" in data:
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        shaped = JsonResponse(
            {"message": str(data["message"]), "extra": data.get("extra") or {}},
            status=response.status_code,
        )
    elif _is_shaped_json(response):
        return response
    else:
        message, extra = _message_for(request, response.status_code)
        shaped = error_json(response.status_code, message, extra)
    for header in KEPT_HEADERS:
        if header in response:
            shaped[header] = response[header]
    return shaped


def _is_shaped_json(response: HttpResponse) -> bool:
    if not response.get("Content-Type", "").startswith("application/json"):
        return False
    if getattr(response, "streaming", False):
        return False
    try:
        body = json.loads(response.content)
    except ValueError:
        return False
    return isinstance(body, dict) and "message" in body and "extra" in body


class ErrorShapeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        api = request.path_info.startswith(API_PREFIX)
        if api:
            refused = _too_big(request)
            if refused is not None:
                return refused
        response = self.get_response(request)
        if api:
            return _as_api_error(request, response)
        if (
            settings.DEBUG
            and response.status_code == 404
            and not getattr(request, "_fleet_view_ran", False)
            and not is_staff_request(request)
        ):
            # No route matched: Django's technical 404 page lists every URL pattern.
            return page_not_found(request, Http404())
        return response

    def process_view(self, request: HttpRequest, *args: Any) -> None:
        request._fleet_view_ran = True  # type: ignore[attr-defined]

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        api = request.path_info.startswith(API_PREFIX)
        if isinstance(exception, RequestDataTooBig):
            return _too_big_response(None) if api else None
        if api:
            return None  # Django's 500 handling logs it; __call__ shapes the response
        if settings.DEBUG and isinstance(exception, Http404) and not is_staff_request(request):
            return page_not_found(request, exception)
        return None
