"""Print the control side's public key, which every agent needs in FLEET_CONTROL_PUBLIC_KEY
to check that the messages it gets come from the control side.

python manage.py control_key
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from fleet.services.wire import control_public_key


class Command(BaseCommand):
    help = "Print the control side's public key (agents' FLEET_CONTROL_PUBLIC_KEY)."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(control_public_key())
