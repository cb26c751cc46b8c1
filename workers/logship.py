"""Shipping job output from the host to the control side, in capped chunks.

The shim writes each attempt's output to a log file on the host. The shipper sends what is
new in each running attempt's file every few seconds, at most `chunk_bytes` per message
and `max_bytes` per attempt, and a last chunk with `eof` once the attempt has ended.
Chunks end on UTF-8 character boundaries (except the last), so every chunk decodes on its
own. Offsets already shipped are kept in a file, so a restarted agent goes on where it
stopped instead of sending everything again. Each chunk names the member's `rank` in its
job (0 for a single-node job), so the control side keeps one log per member of a gang.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.executor import JobKey, read_log

logger = logging.getLogger(__name__)

CHUNK_BYTES = 65536
DEFAULT_MAX_BYTES = 8 << 20


def utf8_safe_end(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte >= 0xF0 else 1
        return len(data) if need <= back else len(data) - back
    return len(data)


class LogShipper:
    """`send(job_id=, attempt=, rank=, offset=, data=<base64>, eof=)` is called for each chunk and
    may raise (the broker is down): the same bytes are offered again on the next call."""

    def __init__(
        self,
        send: Callable[..., Any],
        state_file: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.send = send
        self.state_file = Path(state_file)
        self.max_bytes = max_bytes
        self.chunk_bytes = chunk_bytes
        self._lock = threading.RLock()
        self._paths: dict[JobKey, str] = {}
        self._ranks: dict[JobKey, int] = {}
        self._offsets: dict[JobKey, int] = self._load()

    def _load(self) -> dict[JobKey, int]:
        try:
            raw = json.loads(self.state_file.read_text())
            return {(job_id, int(attempt)): int(off) for job_id, attempt, off in raw}
        except (OSError, ValueError, TypeError):
            return {}

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([[k[0], k[1], off] for k, off in self._offsets.items()]))
        os.replace(tmp, self.state_file)

    def watch(self, key: JobKey, log_path: str, *, fresh: bool = False, rank: int = 0) -> None:
        """Follow an attempt's log file. `fresh`: a new start, shipped from its first byte
        (an adopted attempt resumes from the offset saved before the agent restarted).
        `rank`: this member's rank in its job."""
        with self._lock:
            if fresh or self._paths.get(key) not in (None, log_path):
                self._offsets[key] = 0
            self._paths[key] = log_path
            self._ranks[key] = int(rank)
            self._offsets.setdefault(key, 0)

    def ship(self, key: JobKey | None = None) -> int:
        """Send what is new (of one attempt, or of all); returns the bytes sent."""
        with self._lock:
            keys = [key] if key is not None else list(self._paths)
            sent = sum(self._ship_one(k, final=False) for k in keys if k in self._paths)
            if sent:
                self._save()
            return sent

    def finish(self, key: JobKey) -> None:
        """The attempt has ended: send the rest of its output and the end mark. Raises
        when sending fails (the caller retries)."""
        with self._lock:
            if key not in self._paths:
                return
            self._ship_one(key, final=True)
            self.send(
                job_id=key[0],
                attempt=key[1],
                rank=self._ranks.get(key, 0),
                offset=self._offsets[key],
                data="",
                eof=True,
            )
            del self._paths[key]
            self._ranks.pop(key, None)
            self._offsets.pop(key, None)
            self._save()

    def _ship_one(self, key: JobKey, *, final: bool) -> int:
        sent = 0
        while True:
            offset = self._offsets[key]
            room = min(self.chunk_bytes, self.max_bytes - offset)
            if room <= 0:
                return sent
            data, _ = read_log(self._paths[key], offset, room)
            if not final:
                data = data[: utf8_safe_end(data)]
            if not data:
                return sent
            self.send(
                job_id=key[0],
                attempt=key[1],
                rank=self._ranks.get(key, 0),
                offset=offset,
                data=base64.b64encode(data).decode(),
                eof=False,
            )
            self._offsets[key] = offset + len(data)
            sent += len(data)
            if len(data) < room:
                return sent
