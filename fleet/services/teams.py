"""Teams, memberships and users."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Max
from django.utils.text import slugify

from fleet.errors import ApplicationError
from fleet.models import Membership, Node, Role, Team

TEAM_FIELDS = (
    "name",
    "priority_weight",
    "fairshare_weight",
    "guaranteed_gpus",
    "gpu_limit",
    "user_gpu_cap",
    "default_time_limit",
    "max_time_limit",
    "cpus_per_gpu",
    "memory_mb_per_gpu",
    "cpu_limit",
    "memory_mb_limit",
    "idle_util_percent",
    "idle_minutes",
    "idle_action",
)
# What a team's admins may change themselves (staff change everything): the host CPUs and
# memory its jobs get per GPU when they do not ask, and when its idle GPUs are flagged.
TEAM_ADMIN_FIELDS = (
    "cpus_per_gpu",
    "memory_mb_per_gpu",
    "idle_util_percent",
    "idle_minutes",
    "idle_action",
)
IDLE_ACTIONS = ("warn", "stop")


def team_get_or_create(*, slug: str, name: str | None = None) -> Team:
    slug = slugify(slug)
    if not slug:
        raise ApplicationError("A team needs a slug of letters, digits, hyphens or underscores.")
    team, _ = Team.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return team


def team_update(*, team: Team, data: dict[str, Any]) -> Team:
    """Change quotas and weights; checks the combination before writing anything."""
    unknown = set(data) - set(TEAM_FIELDS)
    if unknown:
        raise ApplicationError(f"These fields cannot be changed: {', '.join(sorted(unknown))}.")
    for key, value in data.items():
        setattr(team, key, value)
    errors: dict[str, list[str]] = {}
    for key in ("priority_weight", "fairshare_weight"):
        if getattr(team, key) <= 0:
            errors[key] = [f"{key} must be greater than 0."]
    if team.gpu_limit is not None and team.gpu_limit < team.guaranteed_gpus:
        errors["gpu_limit"] = [
            f"gpu_limit ({team.gpu_limit}) cannot be below guaranteed_gpus "
            f"({team.guaranteed_gpus}): the limit is the quota plus what the team may borrow."
        ]
    if team.default_time_limit > team.max_time_limit:
        errors["default_time_limit"] = [
            f"default_time_limit ({team.default_time_limit} s) cannot exceed max_time_limit "
            f"({team.max_time_limit} s)."
        ]
    for key in ("cpu_limit", "memory_mb_limit"):
        value = getattr(team, key)
        if value is not None and value <= 0:
            errors[key] = [f"{key} must be greater than 0, or empty for no limit."]
    if not 0 <= team.idle_util_percent <= 100:
        errors["idle_util_percent"] = [
            f"idle_util_percent ({team.idle_util_percent:g}) must be between 0 and 100."
        ]
    if team.idle_minutes < 0:
        errors["idle_minutes"] = ["idle_minutes must be 0 (off) or more."]
    if team.idle_action not in IDLE_ACTIONS:
        errors["idle_action"] = [
            f"idle_action must be warn (flag and notify) or stop (also cancel the job), "
            f"not {team.idle_action!r}."
        ]
    errors.update(_host_default_errors(team, data))
    if errors:
        first = next(iter(errors.values()))[0]
        raise ApplicationError(first, {"fields": errors})
    team.save(update_fields=list(data))
    return team


def _host_default_errors(team: Team, data: dict[str, Any]) -> dict[str, list[str]]:
    """A per-GPU default no node offers for even a one-GPU job would leave every job of the
    team that takes it waiting for ever: refuse it while registered nodes say so."""
    errors: dict[str, list[str]] = {}
    for key, node_field, unit in (
        ("cpus_per_gpu", "cpus", "CPU cores"),
        ("memory_mb_per_gpu", "memory_mb", "MB of host memory"),
    ):
        value = int(data.get(key) or 0)
        if key not in data or value == 0:
            continue
        largest = Node.objects.filter(**{f"{node_field}__isnull": False}).aggregate(
            most=Max(node_field)
        )["most"]
        if largest is not None and value > largest:
            errors[key] = [
                f"{key} ({value}) is more than any node offers: the largest offers {largest} "
                f"{unit}, so a one-GPU job of {team.slug} taking this default could never run. "
                f"Give at most {largest}, or 0 for none."
            ]
    return errors


def membership_add(*, user: Any, team: Team, role: str = Role.MEMBER) -> Membership:
    with transaction.atomic():
        has_default = Membership.objects.filter(user=user, is_default=True).exists()
        membership, created = Membership.objects.get_or_create(
            user=user, team=team, defaults={"role": role, "is_default": not has_default}
        )
        if not created and membership.role != role:
            membership.role = role
            membership.save(update_fields=["role"])
    return membership


def user_get_or_create(*, username: str, password: str | None, staff: bool) -> Any:
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username)
    if password:
        user.set_password(password)
    elif created:
        user.set_unusable_password()
    if staff:
        user.is_staff = True
        user.is_superuser = True
    user.save()
    return user
