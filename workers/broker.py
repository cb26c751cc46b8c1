"""How fleet's processes reach Redis: the URL, and TLS options read from the environment.

Pure: no Django, no Celery. The control side (fleet/settings.py: cache and broker) and the
agent (workers/celery_app.py, broker only) read the same variables, so both speak TLS the
same way:

- `REDIS_URL` (`CELERY_BROKER_URL` for the broker when it differs): the password goes in
  the URL, and `rediss://` means TLS, e.g. `rediss://:PASSWORD@redis.example.org:6380/0`.
- `FLEET_REDIS_CA_FILE`: the CA certificate (PEM) that signed Redis's certificate; unset,
  the system's trust store is used.
- `FLEET_REDIS_CERT_REQS`: `required` (default: the server's certificate must be valid
  and name the host in the URL), `optional` or `none` (no check: for tests only).
- `FLEET_REDIS_CERT_FILE` and `FLEET_REDIS_KEY_FILE`: a client certificate and key, for a
  Redis that asks for one (`tls-auth-clients yes`).

Without TLS options kombu would connect to a `rediss://` URL without checking the
certificate; these options make the check the default.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

DEFAULT_URL = "redis://127.0.0.1:6379/0"
CERT_REQS = {
    "required": ssl.CERT_REQUIRED,
    "optional": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE,
}


class BrokerConfigError(ValueError):
    """The Redis settings in the environment cannot work; the message says which."""


def uses_tls(url: str) -> bool:
    return urlsplit(url).scheme == "rediss"


def redis_ssl_options(url: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """redis-py connection options for `url`: empty for `redis://`, the TLS options from
    the environment for `rediss://` (the keys kombu's `broker_use_ssl` also takes)."""
    if not uses_tls(url):
        return {}
    env = os.environ if environ is None else environ
    reqs = (env.get("FLEET_REDIS_CERT_REQS") or "required").strip().lower()
    if reqs not in CERT_REQS:
        raise BrokerConfigError(
            f"FLEET_REDIS_CERT_REQS must be one of {', '.join(CERT_REQS)}, not {reqs!r}."
        )
    options: dict[str, Any] = {
        "ssl_cert_reqs": CERT_REQS[reqs],
        # A name check needs a verified certificate; `none` turns both off.
        "ssl_check_hostname": reqs == "required",
    }
    for name, key in (
        ("FLEET_REDIS_CA_FILE", "ssl_ca_certs"),
        ("FLEET_REDIS_CERT_FILE", "ssl_certfile"),
        ("FLEET_REDIS_KEY_FILE", "ssl_keyfile"),
    ):
        path = env.get(name)
        if path:
            if not os.path.isfile(path):
                raise BrokerConfigError(f"{name}={path}: no such file.")
            options[key] = path
    return options
