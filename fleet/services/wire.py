"""The control side of the signed channel to agents (workers/wire.py, design rule 9).

The control side signs what it sends with its private key (FLEET_CONTROL_KEY, or the file
FLEET_CONTROL_KEY_FILE, generated there when missing) and checks what agents send against
the public key stored for their node. A refused message is logged with the reason and
changes nothing. Nonces of handled messages are kept in the cache until the message
expires, so a captured report or heartbeat replayed from the broker is refused; a message
redelivered because a worker died while handling it is handled again (handlers are
idempotent), since its nonce is recorded only once it has been handled.
"""

from __future__ import annotations

import logging
import os
import time
from functools import cache as memoize
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.cache import cache

from fleet.models import Node
from workers.wire import (
    CLOCK_SKEW_S,
    Message,
    Signer,
    WireError,
    key_generate,
    open_envelope,
    peek_node,
    public_key_load,
    public_key_of,
)

log = logging.getLogger(__name__)

NONCE_KEY = "wire:nonce:{}"
# How long a stop or reconcile from the control side is good for; a start is good for as
# long as the control side waits for its confirmation (FLEET_START_TIMEOUT), after which
# the start is taken back and may be dispatched elsewhere.
COMMAND_TTL_S = 3600.0


@memoize
def control_private_key() -> str:
    if settings.FLEET_CONTROL_KEY:
        return str(settings.FLEET_CONTROL_KEY).strip()
    path = Path(settings.FLEET_CONTROL_KEY_FILE)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_EXCL: two processes starting at once end up with the same key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(key_generate() + "\n")
    log.info("generated the control side's signing key in %s", path)
    return path.read_text().strip()


def control_public_key() -> str:
    return public_key_of(control_private_key())


@memoize
def _signer() -> Signer:
    return Signer(control_private_key())


def seal_for_node(*, node: str, task: str, args: dict[str, Any], ttl: float) -> dict[str, str]:
    """The signed envelope (Celery kwargs) of a message to `node`'s agent."""
    return _signer().seal(task, node, args, ttl)


def agent_message_open(
    *, task: str, body: Any, signature: Any, now: float | None = None
) -> tuple[Node, Message] | None:
    """The node and message, when the message is signed by that node's key, for `task`,
    current and not handled before; None (and a warning in the log) otherwise."""
    try:
        name = peek_node(body)
    except WireError as exc:
        log.warning("refused %s: %s", task, exc)
        return None
    node = Node.objects.filter(name=name).first()
    if node is None:
        log.warning("refused %s from unknown node %r", task, name[:100])
        return None
    try:
        if not node.public_key:
            raise WireError("the node has no key (manage.py add_node gives it one)")
        message = open_envelope(
            body,
            signature,
            public_key_load(node.public_key),
            task=task,
            node=node.name,
            now=time.time() if now is None else now,
        )
        if _nonce_seen(message.nonce):
            raise WireError("replayed message (its nonce was used before)")
    except WireError as exc:
        log.warning("refused %s from node %r: %s", task, node.name, exc)
        return None
    return node, message


def agent_message_done(message: Message, now: float | None = None) -> None:
    """Record that `message` has been handled, until it expires."""
    left = message.expires_at + CLOCK_SKEW_S - (time.time() if now is None else now)
    try:
        cache.set(NONCE_KEY.format(message.nonce), 1, timeout=max(1, int(left) + 1))
    except Exception:  # the cache is the broker's Redis: with it down, nothing is delivered
        log.warning("could not record the nonce of a handled %s", message.task)


def _nonce_seen(nonce: str) -> bool:
    try:
        return cache.get(NONCE_KEY.format(nonce)) is not None
    except Exception:
        log.warning("cache unavailable: cannot check for a replayed message")
        return False
