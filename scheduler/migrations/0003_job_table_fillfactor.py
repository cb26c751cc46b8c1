"""Leave room in the job table's pages, so the scheduling cycle's wait writes are HOT.

Every cycle rewrites the reason, queue position and ETA of the waiting jobs whose values
moved: after a burst, all of them (10,000 rows). None of those columns is indexed, so
PostgreSQL can write each new row version beside the old one without touching the job
table's 13 indexes (a heap-only tuple), but only where the page has room. With the default
fillfactor (100) it had none: in bench/bench_cycle_db.py 2 % of job updates were HOT, 37 %
with 70. Pages written from now on keep 30 % free; pages already full take it when they are
rewritten (VACUUM FULL, or as rows move). Only PostgreSQL has the setting; elsewhere this
does nothing.
"""

from typing import Any

from django.db import migrations

FILLFACTOR = 70


def _set(apps: Any, schema_editor: Any, value: int | None) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("fleet", "Job")._meta.db_table)
    if value is None:
        schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    else:
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(value)})")


def forward(apps: Any, schema_editor: Any) -> None:
    _set(apps, schema_editor, FILLFACTOR)


def backward(apps: Any, schema_editor: Any) -> None:
    _set(apps, schema_editor, None)


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0012_job_arrays"),
        ("scheduler", "0002_default_policy_gittins_tiers"),
    ]

    operations = [migrations.RunPython(forward, backward)]
