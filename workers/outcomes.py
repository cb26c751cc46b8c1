"""How attempts ended, kept on the agent's disk until the control side acknowledges them
(design rule 8: outcomes are durable).

The supervisor's final event for an attempt (succeeded, failed, timeout, cancelled,
preempted, lost) is written here before it is reported. Every heartbeat and registration
repeats whatever is still here, and the control side's acknowledgement (with the lease
renewal, workers.lease) removes it. So a report lost in the broker (a flush, a control
worker killed mid-task, a database outage longer than the retries) is sent again until it
has been applied, and a finished job is never taken for lost and run again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Heartbeats carry at most this many outcomes; the rest follow with the next ones.
PER_MESSAGE = 200


def _name(job_id: Any, attempt: int) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{job_id}.{attempt}") + ".json"


class OutcomeStore:
    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def keep(self, event: dict[str, Any]) -> None:
        """Write the attempt's final event (atomically; writing it again replaces it)."""
        path = self.folder / _name(event["job_id"], int(event["attempt"]))
        tmp = path.with_suffix(".tmp")
        with self._lock:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump(event, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)

    def pending(self, limit: int = PER_MESSAGE) -> list[dict[str, Any]]:
        """Outcomes not yet acknowledged, oldest first."""
        events = []
        with self._lock:
            paths = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
            for path in paths[:limit]:
                try:
                    events.append(json.loads(path.read_text()))
                except (OSError, ValueError) as exc:
                    logger.warning("unreadable outcome %s dropped: %s", path, exc)
                    path.unlink(missing_ok=True)
        return events

    def acknowledge(self, keys: Iterable[Any]) -> int:
        """Forget the outcomes of these (job_id, attempt) pairs; returns how many."""
        done = 0
        with self._lock:
            for job_id, attempt in keys:
                path = self.folder / _name(job_id, int(attempt))
                if path.exists():
                    path.unlink()
                    done += 1
        return done
