"""The agent's Celery app: configured from the environment, without Django.

An agent needs the broker URL (with the password; `rediss://` and FLEET_REDIS_CA_FILE for
TLS, see workers/broker.py) and its node key, never database credentials. It consumes
only its own queue, `node.<name>`, and sends everything it reports to the control queue.
Start/stop messages are acknowledged late: an agent that dies mid-task leaves the message
for its next start, and starting an attempt twice starts it once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from celery import Celery
from kombu import Queue

from workers.broker import DEFAULT_URL, redis_ssl_options

CONTROL_QUEUE = "control"


def node_queue(node_name: str) -> str:
    """Same naming as the control side (fleet.celery.node_queue), without importing it."""
    return f"node.{node_name}"


def broker_url(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("CELERY_BROKER_URL") or env.get("REDIS_URL") or DEFAULT_URL


def control_queue(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("FLEET_CONTROL_QUEUE") or CONTROL_QUEUE


# fixups=[]: Celery would otherwise set Django up whenever DJANGO_SETTINGS_MODULE is set.
# set_as_current=False: the control worker imports this module while discovering tasks and
# must keep its own app as the current one.
app = Celery("fleet-agent", fixups=[], set_as_current=False)
app.conf.update(
    broker_url=broker_url(),
    # rediss://: TLS with the certificate checked (FLEET_REDIS_CA_FILE, workers/broker.py).
    broker_use_ssl=redis_ssl_options(broker_url()) or None,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    result_backend=None,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_enable_remote_control=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    # A start or stop taken by an agent that died before acknowledging it goes back to the
    # queue after this many seconds (a start by then has usually expired: harmless).
    broker_transport_options={
        "visibility_timeout": int(os.environ.get("FLEET_REDELIVER_AFTER") or 120)
    },
    task_time_limit=60,
)


def configure(node_name: str, broker: str | None = None) -> Celery:
    """Point the app at the broker and at this node's queue only."""
    queue = node_queue(node_name)
    url = broker or broker_url()
    app.conf.update(
        broker_url=url,
        broker_use_ssl=redis_ssl_options(url) or None,
        task_default_queue=queue,
        task_queues=[Queue(queue)],
    )
    return app
