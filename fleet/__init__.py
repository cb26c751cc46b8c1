"""fleet: GPU fleet scheduler. This package is the Django project and its core domain."""

from fleet.celery import app as celery_app

__all__ = ["celery_app"]
