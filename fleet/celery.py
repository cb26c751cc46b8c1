"""The Celery app shared by the control worker, beat and the GPU-host agents."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleet.settings")

CONTROL_QUEUE = "control"


def node_queue(node_name: str) -> str:
    """The queue an agent consumes: only its own host's work."""
    return f"node.{node_name}"


app = Celery("fleet")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["fleet", "scheduler", "workers"])
