"""The agent's lease: its right to keep running jobs, renewed by the control side (design
rule 7: no job outlives its right to run).

Every heartbeat carries the agent's clock reading; the control side answers each one it
has applied with an acknowledgement echoing that reading, and the lease then runs until
that reading plus `FLEET_LEASE_S`. So the lease only ever counts from a moment the control
side is known to have heard from this agent, whatever the two clocks say.

The lease lives in a file (`valid_until`, a Unix time) that each job's shim reads too: when
it has run out, the shim stops its job (SIGTERM, the job's grace, SIGKILL), even when the
agent itself is dead or frozen. The control side declares a silent node's jobs lost only
after heartbeat timeout + lease + grace + a margin, when they are surely stopped, so a job
never runs on two nodes at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_LEASE_S = 180.0


def lease_read(path: str | os.PathLike[str]) -> float | None:
    """The lease's end (Unix time), or None when there is no lease file."""
    try:
        return float(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


class Lease:
    def __init__(
        self,
        path: str | os.PathLike[str],
        seconds: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.seconds = seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._until = lease_read(self.path)
        if self._until is None:
            # A new agent runs nothing yet: one period to register and hear back.
            self._write(self.clock() + seconds)

    @property
    def valid_until(self) -> float:
        return self._until or 0.0

    def expired(self) -> bool:
        return self.clock() > self.valid_until

    def renew(self, heard_at: float) -> bool:
        """The control side has heard the agent's message sent at `heard_at` (agent clock);
        True when that extends the lease."""
        with self._lock:
            until = heard_at + self.seconds
            if self._until is not None and until <= self._until:
                return False
            was_expired = self.expired()
            self._write(until)
        if was_expired:
            logger.warning("lease renewed: the control side answers again")
        return True

    def _write(self, until: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{until:.3f}\n")
        os.replace(tmp, self.path)
        self._until = until
