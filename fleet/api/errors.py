"""One JSON shape for every API error: {"message": ..., "extra": {...}}."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from fleet.errors import ApplicationError


def _first_message(detail: Any) -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            inner = _first_message(value)
            return inner if key == "non_field_errors" else f"{key}: {inner}"
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    return str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ApplicationError):
        return Response({"message": exc.message, "extra": exc.extra}, status=exc.status_code)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("Not found.")
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        detail = response.data
        fields = detail if isinstance(detail, dict) else {"non_field_errors": detail}
        response.data = {"message": _first_message(fields), "extra": {"fields": fields}}
    else:
        message = (
            response.data.get("detail", str(exc)) if isinstance(response.data, dict) else str(exc)
        )
        response.data = {"message": str(message), "extra": {}}
    if response.status_code == status.HTTP_401_UNAUTHORIZED and not response.data["message"]:
        response.data["message"] = "Log in, or send 'Authorization: Token <key>'."
    return response
