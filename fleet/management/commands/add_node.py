"""Create a GPU node (or give it a new key) and print its agent key as the last line.

python manage.py add_node gpu-01 [--heartbeat-timeout 30]

The agent on that host passes the key in FLEET_NODE_KEY or FLEET_NODE_KEY_FILE (or --key),
and the control side's public key, printed on standard error (and by
`manage.py control_key`), in FLEET_CONTROL_PUBLIC_KEY. Only the public half of the node key
is stored; running the command again replaces the key, and the old one stops working.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fleet.services.agents import node_key_create
from fleet.services.wire import control_public_key


class Command(BaseCommand):
    help = "Create a node (or rotate its key) and print the agent key last."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--heartbeat-timeout", type=int, help="Seconds (default 30).")

    def handle(self, *args: Any, **options: Any) -> None:
        node, key = node_key_create(name=options["name"])
        if options["heartbeat_timeout"]:
            node.heartbeat_timeout = options["heartbeat_timeout"]
            node.save(update_fields=["heartbeat_timeout"])
        self.stderr.write(
            f"node {node.name}: new agent key (only its public half is stored).\n"
            f"Run its agent with FLEET_NODE_KEY=<the key below> and "
            f"FLEET_CONTROL_PUBLIC_KEY={control_public_key()}"
        )
        self.stdout.write(key)
