"""Who may see and do what. Used by selectors and services alike."""

from __future__ import annotations

from typing import Any

from fleet.models import Job, Membership, Role


def memberships_of(user: Any) -> list[Membership]:
    """The user's memberships with their teams, read once per request (cached on the user
    object, like the team ids below, which come from them)."""
    if not user.is_authenticated:
        return []
    cached = getattr(user, "_fleet_memberships", None)
    if cached is None:
        cached = list(Membership.objects.filter(user=user).select_related("team"))
        user._fleet_memberships = cached
    return cached


def team_ids(user: Any) -> set[int]:
    if not user.is_authenticated:
        return set()
    cached = getattr(user, "_fleet_team_ids", None)
    if cached is None:
        cached = {m.team_id for m in memberships_of(user)}
        user._fleet_team_ids = cached
    return cached


def admin_team_ids(user: Any) -> set[int]:
    if not user.is_authenticated:
        return set()
    cached = getattr(user, "_fleet_admin_team_ids", None)
    if cached is None:
        cached = {m.team_id for m in memberships_of(user) if m.role == Role.ADMIN}
        user._fleet_admin_team_ids = cached
    return cached


def can_use_fleet(user: Any) -> bool:
    """Members of any team see the fleet and the queue; staff see everything."""
    return bool(user.is_authenticated and (user.is_staff or team_ids(user)))


def can_manage_job(user: Any, job: Job) -> bool:
    """Owner, admins of the job's team, and staff may act on a job and read its env and logs."""
    if not user.is_authenticated:
        return False
    if user.is_staff or job.owner_id == user.id:
        return True
    return job.team_id in admin_team_ids(user)


def can_see_command(user: Any, job: Job) -> bool:
    return can_manage_job(user, job) or job.team_id in team_ids(user)
