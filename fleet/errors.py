"""The one error type for expected failures. The API turns it into
`{"message": ..., "extra": {...}}` with its status code."""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    status_code = 400

    def __init__(self, message: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra or {}


class NotAllowed(ApplicationError):
    status_code = 403


class NotFound(ApplicationError):
    status_code = 404


class Conflict(ApplicationError):
    """The request is valid but the object's current state does not allow it."""

    status_code = 409
