"""Reading what the control side sends to agents in tests that record messages instead of
sending them: the arguments inside the signed envelope, after checking the signature the
agent would check."""

from __future__ import annotations

import json
import time
from typing import Any

from fleet.services.wire import control_public_key
from workers.wire import open_envelope, public_key_load


def node_message_args(task: str, queue: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The signed arguments of a message to an agent (`queue` is node.<name>), or `kwargs`
    themselves for a message to the control queue (not signed: it never leaves the control
    side's trust)."""
    if not queue.startswith("node."):
        return kwargs
    node = json.loads(kwargs["m"])["node"]
    assert queue == f"node.{node}"
    key = public_key_load(control_public_key())
    return open_envelope(kwargs["m"], kwargs["s"], key, task=task, node=node, now=time.time()).args
