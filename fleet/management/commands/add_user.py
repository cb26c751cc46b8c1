"""Create (or update) a user and print an API token as the last line.

python manage.py add_user alice --team vision [--team-admin] [--staff] [--password P]
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from fleet.models import Role
from fleet.services.teams import membership_add, team_get_or_create, user_get_or_create
from fleet.services.tokens import token_rotate


class Command(BaseCommand):
    help = "Create a user (and its team if needed) and print the user's API token last."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--team", help="Team slug; the team is created if it does not exist.")
        parser.add_argument("--team-admin", action="store_true", help="Make the user a team admin.")
        parser.add_argument("--staff", action="store_true", help="Make the user staff (superuser).")
        parser.add_argument("--password", help="Password for the web login; none by default.")

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            user = user_get_or_create(
                username=options["username"], password=options["password"], staff=options["staff"]
            )
            if options["team"]:
                team = team_get_or_create(slug=options["team"])
                role = Role.ADMIN if options["team_admin"] else Role.MEMBER
                membership_add(user=user, team=team, role=role)
                self.stderr.write(f"{user.username} is {role} of team {team.slug}")
            key = token_rotate(user=user)
        self.stdout.write(key)
