"""API tokens: random keys, stored as SHA-256 only, shown once at creation."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import transaction

from fleet.models import ApiToken


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def token_rotate(*, user: Any) -> str:
    """Create the user's token, or replace it (the old key stops working). Returns the key."""
    key = secrets.token_urlsafe(32)
    with transaction.atomic():
        ApiToken.objects.update_or_create(
            user=user, defaults={"key_hash": hash_key(key), "prefix": key[:8]}
        )
    return key
