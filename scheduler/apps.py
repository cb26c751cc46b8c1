from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_defaults(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    # Imported here: the app registry is not ready when this module loads.
    from scheduler.cycle.config import ensure_defaults

    ensure_defaults(using=using)


class SchedulerConfig(AppConfig):
    name = "scheduler"
    verbose_name = "scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The settings row and the "scheduler tick" periodic task exist after every
        # migrate, created once and left alone afterwards (admins edit them).
        post_migrate.connect(_ensure_defaults, sender=self, dispatch_uid="scheduler-defaults")
