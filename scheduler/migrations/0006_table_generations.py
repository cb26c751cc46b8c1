"""A generation number per seldom-written table, kept by the database (TableGeneration).

The scheduling cycle reads the GPU inventory every cycle unless it knows the rows are those
it read last time. A statement-level trigger on the GPU table sets the table's generation
from a sequence after every INSERT, UPDATE, DELETE or TRUNCATE, by any writer, so one short
row tells the cycle whether to read 8,000 GPU rows again (an md5 of them, computed by
PostgreSQL, cost 5-12 ms a cycle on a 1,000-node fleet). Only PostgreSQL gets the
trigger; elsewhere the table stays empty and the inventory is read every cycle.
"""

from typing import Any

from django.db import migrations, models

SEQUENCE = "scheduler_table_generation_seq"
FUNCTION = "scheduler_bump_table_generation"
TRIGGERED = ("Gpu",)


def _tables(apps: Any, schema_editor: Any) -> list[tuple[str, str]]:
    return [
        (name, schema_editor.quote_name(apps.get_model("fleet", name)._meta.db_table))
        for name in TRIGGERED
    ]


def forward(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    generations = schema_editor.quote_name(
        apps.get_model("scheduler", "TableGeneration")._meta.db_table
    )
    schema_editor.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}")
    schema_editor.execute(
        f"""
        CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {generations} ("table", value)
            VALUES (TG_TABLE_NAME, nextval('{SEQUENCE}'))
            ON CONFLICT ("table") DO UPDATE SET value = EXCLUDED.value;
            RETURN NULL;
        END
        $$
        """
    )
    for name, table in _tables(apps, schema_editor):
        schema_editor.execute(
            f"CREATE TRIGGER scheduler_generation_{name.lower()} "
            f"AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()"
        )
        schema_editor.execute(
            f'INSERT INTO {generations} ("table", value) '
            f"VALUES ('{apps.get_model('fleet', name)._meta.db_table}', nextval('{SEQUENCE}')) "
            'ON CONFLICT ("table") DO UPDATE SET value = EXCLUDED.value'
        )


def backward(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, table in _tables(apps, schema_editor):
        schema_editor.execute(
            f"DROP TRIGGER IF EXISTS scheduler_generation_{name.lower()} ON {table}"
        )
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")
    schema_editor.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0012_job_arrays"),
        ("scheduler", "0005_queue_order_packed"),
    ]

    operations = [
        migrations.CreateModel(
            name="TableGeneration",
            fields=[
                ("table", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("value", models.BigIntegerField()),
            ],
        ),
        migrations.RunPython(forward, backward),
    ]
