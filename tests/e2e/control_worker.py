"""The control worker as the e2e tests run it: fleet's Celery app consuming one control
queue, with the control side's own messages (schedule requests) sent to that same queue,
so a test's pieces talk only to each other even when a developer's stack shares Redis.

    python -m tests.e2e.control_worker QUEUE
"""

from __future__ import annotations

import sys

import django


def main(queue: str) -> None:
    django.setup()
    from fleet.celery import app
    from fleet.services import messaging

    messaging.CONTROL_QUEUE = queue
    app.worker_main(
        ["worker", "-Q", queue, "--pool", "solo", "--loglevel", "INFO", "-n", f"{queue}@%h",
         "--without-gossip", "--without-mingle", "--without-heartbeat"]
    )  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
