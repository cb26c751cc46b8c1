"""Node administration: drain and resume."""

from __future__ import annotations

from typing import Any

from fleet.errors import Conflict
from fleet.models import Node, NodeState
from fleet.services import messaging


def node_drain(*, node: Node, user: Any, reason: str = "") -> Node:
    """A draining node takes no new jobs; its running jobs finish."""
    if node.state == NodeState.DOWN:
        raise Conflict(f"Node {node.name} is down; only an up node can be drained.")
    node.state = NodeState.DRAINING
    node.state_reason = reason or f"drained by {user.get_username()}"
    node.drain_requested = True
    node.save(update_fields=["state", "state_reason", "drain_requested"])
    messaging.request_schedule()
    return node


def node_resume(*, node: Node, user: Any) -> Node:
    if node.state == NodeState.DOWN:
        raise Conflict(
            f"Node {node.name} is down; it comes back up when its agent sends a heartbeat."
        )
    node.state = NodeState.UP
    node.state_reason = ""
    node.drain_requested = False
    node.save(update_fields=["state", "state_reason", "drain_requested"])
    messaging.request_schedule()
    return node
