"""Development mode's technical error pages, for staff only.

With DEBUG on, Django renders an exception's technical page (settings, local variables,
the request) to whoever caused it. This reporter keeps that page for staff and gives
everyone else the plain error page, with the same status code.
"""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe
from django.views.debug import ExceptionReporter


def is_staff_request(request: Any) -> bool:
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_staff)


class StaffOnlyExceptionReporter(ExceptionReporter):
    def _plain(self) -> bool:
        return not is_staff_request(self.request)

    def get_traceback_html(self) -> SafeString:
        if self._plain():
            return mark_safe(render_to_string("500.html"))  # noqa: S308 (our own template)
        return super().get_traceback_html()

    def get_traceback_text(self) -> SafeString:
        if self._plain():
            return mark_safe("Server error. It has been logged; if it persists, tell an admin.")
        return super().get_traceback_text()
