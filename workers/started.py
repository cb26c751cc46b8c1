"""The attempts an agent has started, kept on disk: a start message delivered twice, or
again after the job ended or the agent restarted, starts nothing the second time.

One line per start in a file of the agent's state directory, appended before the job is
spawned; the last `STARTED_MEMORY` lines are read back on start-up.
"""

from __future__ import annotations

import os
from typing import Any

from workers.executor import JobKey

STARTED_MEMORY = 10000  # attempts remembered as started, against redelivered starts


class StartedAttempts:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path
        try:
            with open(path) as fh:
                lines = fh.read().split()
        except OSError:
            lines = []
        self._tokens = set(lines[-STARTED_MEMORY:])

    def mark(self, key: JobKey, dispatch: Any = None) -> bool:
        """Remember the attempt before starting it; False if it was started before.

        `dispatch` names the control side's dispatch (its time); with it, a start for the
        same job id and attempt from another dispatch (a control side whose database was
        reset reuses ids) is a new start, while a redelivered message is not."""
        token = f"{key[0]}.{key[1]}" + (f"@{dispatch}" if dispatch else "")
        if token in self._tokens:
            return False
        self._tokens.add(token)
        with open(self.path, "a") as fh:
            fh.write(token + "\n")
        return True
