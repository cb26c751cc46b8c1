# Nodes sign their messages with an Ed25519 key; the control side keeps the public half.
# A hash of a shared secret cannot verify a signature, so every node needs a new key
# (`manage.py add_node NAME`).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0005_node_drain_requested"),
    ]

    operations = [
        migrations.RemoveField(model_name="node", name="key_hash"),
        migrations.AddField(
            model_name="node",
            name="public_key",
            field=models.CharField(blank=True, editable=False, max_length=64),
        ),
    ]
