from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from fleet.errors import NotFound
from fleet.models import Team


def team_list(*, fetched_by: Any) -> QuerySet[Team]:
    return Team.objects.all()


def team_get(*, slug: str, fetched_by: Any) -> Team:
    team = team_list(fetched_by=fetched_by).filter(slug=slug).first()
    if team is None:
        raise NotFound(f"Team '{slug}' does not exist.")
    return team
