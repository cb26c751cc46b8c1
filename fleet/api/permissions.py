from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

from fleet.services.access import can_use_fleet


class IsTeamMemberOrStaff(BasePermission):
    """Members of any team and staff; a user in no team sees only /api/v1/me/."""

    message = "You are not a member of any team; ask an admin to add you to one."

    def has_permission(self, request: Any, view: Any) -> bool:
        return can_use_fleet(request.user)


class IsStaff(BasePermission):
    message = "Only staff may do this."

    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)
