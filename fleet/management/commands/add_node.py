"""Create a GPU node (or give it a new key) and print its agent key as the last line.

python manage.py add_node gpu-01 [--heartbeat-timeout 30]

The agent on that host passes the key in FLEET_NODE_KEY (or --key). Only a hash is stored;
running the command again replaces the key, and the old one stops working.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fleet.services.agents import node_key_create


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
        self.stderr.write(f"node {node.name}: new agent key (only its hash is stored)")
        self.stdout.write(key)
