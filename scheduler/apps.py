from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save


def _ensure_defaults(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    # Imported here: the app registry is not ready when this module loads.
    from scheduler.cycle.config import ensure_defaults

    ensure_defaults(using=using)


def _gpu_changed(sender: Any, **kwargs: Any) -> None:
    from scheduler.cycle.admission import fleet_shape_changed

    fleet_shape_changed()


def _node_saved(sender: Any, update_fields: Any = None, **kwargs: Any) -> None:
    from scheduler.cycle.admission import SHAPE_FIELDS

    if update_fields is None or SHAPE_FIELDS & set(update_fields):
        _gpu_changed(sender)


class SchedulerConfig(AppConfig):
    name = "scheduler"
    verbose_name = "scheduler"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The settings row and the "scheduler tick" periodic task exist after every
        # migrate, created once and left alone afterwards (admins edit them).
        post_migrate.connect(_ensure_defaults, sender=self, dispatch_uid="scheduler-defaults")
        # Admission keeps the fleet's shape between submits (scheduler.cycle.admission):
        # a GPU or node written through the ORM (the admin, a cascade) tells it. Writes by
        # queryset update call fleet_shape_changed themselves (fleet.services.agents).
        from fleet.models import Gpu, Node

        for signal in (post_save, post_delete):
            signal.connect(_gpu_changed, sender=Gpu, dispatch_uid=f"shape-gpu-{signal}")
        post_save.connect(_node_saved, sender=Node, dispatch_uid="shape-node-saved")
        post_delete.connect(_gpu_changed, sender=Node, dispatch_uid="shape-node-deleted")
