"""Reading job logs in pieces, for the log view and `fleetctl logs --follow`."""

from __future__ import annotations

import os

MAX_READ_BYTES = 1024 * 1024


def read_log(
    path: str | os.PathLike[str], offset: int = 0, limit: int = 65536
) -> tuple[bytes, int]:
    """Up to `limit` bytes (at most MAX_READ_BYTES) from `offset`, and the offset to ask for
    next. A negative offset counts from the end (`-4096`: the last 4 KiB). A log that does
    not exist yet reads as empty, so a client can poll before the job writes anything."""
    limit = max(0, min(limit, MAX_READ_BYTES))
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = max(0, size + offset) if offset < 0 else min(offset, size)
            fh.seek(start)
            data = fh.read(limit)
    except FileNotFoundError:
        return b"", max(offset, 0)
    return data, start + len(data)
