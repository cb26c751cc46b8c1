"""Signed messages between the control side and agents (design rule 9: trust nothing on the
wire).

Anyone who can reach the broker can put a message on any queue, so a message is believed
only for its signature. Every message, in both directions, is an envelope of two Celery
keyword arguments:

- `m`: the body, a JSON text `{"v", "task", "node", "iat", "exp", "nonce", "args"}`;
- `s`: an Ed25519 signature over `fleet-wire-1\\n` + the body's UTF-8 bytes.

The control side holds one private key and signs what it sends to agents; each agent holds
the control side's public key. Each node holds its own private key (its node key) and signs
what it reports; the control side stores only that node's public key. So a broker client
can forge nothing, a database reader learns no secret, and a node can speak only for itself.

The body names its task and its node, so a signed stop cannot be replayed as a start, nor a
message for one node on another node's queue. `exp` bounds how long a captured message is
any good, and the receiver remembers each `nonce` until then, so it is acted on once.
Pure Python over `cryptography`: no Django, no Celery.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

VERSION = 1
DOMAIN = b"fleet-wire-1\n"
# How far the sender's clock may run ahead of the receiver's, and how long past its expiry a
# message is still taken (clocks are kept by NTP; this absorbs what NTP leaves).
CLOCK_SKEW_S = 30.0
MAX_BODY_BYTES = 4 * 1024 * 1024

# How long each message an agent sends is good for. Job outcomes and output wait in the
# broker while the control worker is down, so they keep for a day; liveness does not.
AGENT_MESSAGE_TTL_S: dict[str, float] = {
    "fleet.tasks.agent_register": 300.0,
    "fleet.tasks.agent_heartbeat": 60.0,
    "fleet.tasks.telemetry": 120.0,
    "fleet.tasks.job_report": 86400.0,
    "fleet.tasks.job_log": 86400.0,
}
DEFAULT_TTL_S = 300.0


class WireError(ValueError):
    """A message that must not be acted on; the text says why (for the receiver's log)."""


# -- keys -------------------------------------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(text: str) -> bytes:
    """Strict URL-safe base64 (padding optional): anything else raises ValueError."""
    text = text.strip()
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def _unb64(text: str, what: str) -> bytes:
    try:
        raw = _decode(text)
    except (binascii.Error, ValueError):
        raise WireError(f"{what} is not URL-safe base64") from None
    if len(raw) != 32:
        raise WireError(f"{what} must be 32 bytes, got {len(raw)}")
    return raw


def key_generate() -> str:
    """A new private key: 32 random bytes, URL-safe base64."""
    return _b64(secrets.token_bytes(32))


def private_key_load(text: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(_unb64(text, "the private key"))


def public_key_load(text: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(_unb64(text, "the public key"))


def public_key_of(private: str) -> str:
    raw = private_key_load(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return _b64(raw)


# -- sealing and opening ----------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    task: str
    node: str
    issued_at: float
    expires_at: float
    nonce: str
    args: dict[str, Any]


class Signer:
    """Seals messages with one private key."""

    def __init__(self, private: str, clock: Callable[[], float] = time.time) -> None:
        self._key = private_key_load(private)
        self.clock = clock

    def seal(self, task: str, node: str, args: Mapping[str, Any], ttl: float) -> dict[str, str]:
        now = self.clock()
        body = json.dumps(
            {
                "v": VERSION,
                "task": task,
                "node": node,
                "iat": round(now, 3),
                "exp": round(now + ttl, 3),
                "nonce": secrets.token_hex(16),
                "args": dict(args),
            },
            separators=(",", ":"),
            allow_nan=False,
        )
        signature = self._key.sign(DOMAIN + body.encode())
        return {"m": body, "s": _b64(signature)}


def peek_node(body: Any) -> str:
    """The node a body claims to come from or go to, before its signature is checked (to
    pick the key to check it with). Raises WireError when there is no body to speak of."""
    return str(_parse(body).get("node", ""))


def _parse(body: Any) -> dict[str, Any]:
    if not isinstance(body, str) or not body:
        raise WireError("unsigned message (no envelope)")
    if len(body) > MAX_BODY_BYTES:
        raise WireError(f"message body over {MAX_BODY_BYTES} bytes")
    try:
        parsed = json.loads(body)
    except ValueError:
        raise WireError("message body is not JSON") from None
    if not isinstance(parsed, dict):
        raise WireError("message body is not a JSON object")
    return parsed


def open_envelope(
    body: Any,
    signature: Any,
    key: Ed25519PublicKey,
    *,
    task: str,
    node: str,
    now: float,
) -> Message:
    """The message, when `signature` is `key`'s over `body`, it is for `task` and `node`,
    and it is current. Raises WireError saying which check failed."""
    parsed = _parse(body)
    if not isinstance(signature, str) or not signature:
        raise WireError("unsigned message (no signature)")
    try:
        key.verify(_decode(signature), DOMAIN + body.encode())
    except (InvalidSignature, binascii.Error, ValueError):
        raise WireError("bad signature") from None
    # Signed, so the fields are the signer's; check they say what the receiver expects.
    try:
        message = Message(
            task=str(parsed["task"]),
            node=str(parsed["node"]),
            issued_at=float(parsed["iat"]),
            expires_at=float(parsed["exp"]),
            nonce=str(parsed["nonce"]),
            args=dict(parsed["args"]),
        )
    except (KeyError, TypeError, ValueError):
        raise WireError("signed message lacks a field") from None
    if parsed.get("v") != VERSION:
        raise WireError(f"message version {parsed.get('v')!r}, expected {VERSION}")
    if message.task != task:
        raise WireError(f"signed for task {message.task!r}, delivered to {task!r}")
    if message.node != node:
        raise WireError(f"signed for node {message.node!r}, delivered to {node!r}")
    if not (math.isfinite(message.issued_at) and math.isfinite(message.expires_at)):
        raise WireError("non-finite timestamps")
    if message.issued_at > now + CLOCK_SKEW_S:
        raise WireError(f"issued {message.issued_at - now:.0f} s in the future (clock skew?)")
    if now > message.expires_at + CLOCK_SKEW_S:
        raise WireError(f"expired {now - message.expires_at:.0f} s ago")
    if len(message.nonce) < 16:
        raise WireError("nonce too short")
    return message


# -- replay -----------------------------------------------------------------------------------


class NonceBook:
    """The nonces an agent has acted on, each until its message expires, kept in a file so a
    restarted agent still refuses a replay. A message's nonce is recorded after it has been
    handled: a message redelivered because the agent died while handling it is handled
    again (the handlers are idempotent), while a replay of a handled one is refused."""

    def __init__(self, path: str | os.PathLike[str], clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}
        self._load()

    def _load(self) -> None:
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            lines = []
        now = self.clock()
        for line in lines:
            nonce, _, exp = line.partition(" ")
            try:
                until = float(exp)
            except ValueError:
                continue
            if until + CLOCK_SKEW_S >= now:
                self._seen[nonce] = until
        self._rewrite()

    def _rewrite(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.writelines(f"{n} {exp}\n" for n, exp in self._seen.items())
        os.replace(tmp, self.path)

    def seen(self, nonce: str) -> bool:
        with self._lock:
            return nonce in self._seen

    def remember(self, message: Message) -> None:
        with self._lock:
            self._seen[message.nonce] = message.expires_at
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as fh:
                fh.write(f"{message.nonce} {message.expires_at}\n")
            if len(self._seen) % 1000 == 0:
                now = self.clock()
                self._seen = {n: exp for n, exp in self._seen.items() if exp + CLOCK_SKEW_S >= now}
                self._rewrite()


class Gate:
    """What an agent lets through: messages signed by the control side, for this node and
    the task they arrive as, current, and not acted on before."""

    def __init__(
        self,
        *,
        node: str,
        control_public_key: str,
        nonces: NonceBook,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.key = public_key_load(control_public_key)
        self.nonces = nonces
        self.clock = clock

    def open(self, task: str, body: Any, signature: Any) -> Message:
        message = open_envelope(
            body, signature, self.key, task=task, node=self.node, now=self.clock()
        )
        if self.nonces.seen(message.nonce):
            raise WireError("replayed message (its nonce was used before)")
        return message

    def done(self, message: Message) -> None:
        self.nonces.remember(message)
