"""Periodic ticks of the agent side of the control worker, as database rows that an admin
can edit (interval, enabled) in the Django admin. Created only when missing, so a later
migrate never undoes an admin's change."""

from django.db import migrations

SCHEDULES = [
    # (name, task, every seconds)
    ("fleet: reap silent nodes", "fleet.tasks.reap_nodes", 10),
    ("fleet: telemetry rollup and retention", "fleet.tasks.telemetry_rollup", 60),
]


def create(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    for name, task, every in SCHEDULES:
        if PeriodicTask.objects.filter(name=name).exists():
            continue
        interval, _ = IntervalSchedule.objects.get_or_create(every=every, period="seconds")
        PeriodicTask.objects.create(
            name=name, task=task, interval=interval, queue="control", enabled=True
        )


def remove(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name__in=[name for name, _, _ in SCHEDULES]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0002_node_key_telemetry_job_logs"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create, remove)]
