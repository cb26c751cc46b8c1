"""Job output shipped by agents, stored in capped chunks.

Why over the broker and into the database: the web never talks to GPU hosts (they may sit
behind a firewall and only reach Redis), any web replica can serve any log, and a log stays
readable after its node is gone. The agent reads the job's log file in chunks of at most
64 KiB and sends each with its byte offset; the control side keeps at most
FLEET_LOG_MAX_BYTES per attempt (the full log stays on the host, capped by the shim).
Chunks are keyed by (job, attempt, rank, offset), so a chunk sent twice is stored once; each
member of a multi-node job ships its own output under its rank.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from fleet.models import Job, JobLogChunk, JobMember, Node
from fleet.models.jobs import FINAL_STATES

log = logging.getLogger(__name__)


def log_max_bytes() -> int:
    value = getattr(settings, "FLEET_LOG_MAX_BYTES", None)
    return int(value if value is not None else os.environ.get("FLEET_LOG_MAX_BYTES", 8 << 20))


def log_chunk_store(
    *,
    node: Node,
    job_id: int,
    attempt: int,
    offset: int,
    data_b64: str,
    eof: bool = False,
    rank: int = 0,
) -> bool:
    """Keep one chunk of an attempt's output; False when it is refused (not this node's
    current attempt or member, past the cap) or was already stored."""
    job = Job.objects.filter(id=job_id).values("id", "attempt", "node_id").first()
    if job is None or job["attempt"] != attempt or not _writes_rank(job, node, attempt, rank):
        log.info(
            "dropped a log chunk of job %s.%s rank %s from node %s",
            job_id,
            attempt,
            rank,
            node.name,
        )
        return False
    data = base64.b64decode(data_b64)
    cap = log_max_bytes()
    if offset < 0 or offset > cap:
        return False
    data = data[: cap - offset]
    if not data and not eof:
        return False
    if JobLogChunk.objects.filter(
        job_id=job_id, attempt=attempt, rank=rank, offset=offset
    ).exists():
        return False  # a redelivered chunk
    # ignore_conflicts: two workers may store the same redelivered chunk at once.
    JobLogChunk.objects.bulk_create(
        [
            JobLogChunk(
                job_id=job_id,
                attempt=attempt,
                rank=rank,
                offset=offset,
                end=offset + len(data),
                data=data,
                eof=eof,
            )
        ],
        ignore_conflicts=True,
    )
    return True


def _writes_rank(job: Mapping[str, Any], node: Node, attempt: int, rank: int) -> bool:
    """Whether `node` ran member `rank` of the attempt. A job whose attempt has no member
    rows (dispatched before members were recorded) has only rank 0, on its own node (or on
    none once it has left it)."""
    member = (
        JobMember.objects.filter(job_id=job["id"], attempt=attempt, rank=rank)
        .values_list("node_id", flat=True)
        .first()
    )
    if member is not None:
        return member == node.pk
    return rank == 0 and job["node_id"] in (node.pk, None)


def log_retention() -> timedelta:
    return timedelta(seconds=float(settings.FLEET_LOG_RETENTION))


def log_prune(*, now: datetime | None = None) -> int:
    """Delete the stored output of jobs that finished longer than FLEET_LOG_RETENTION ago
    (30 days by default), so the table stays bounded; the job rows and events stay."""
    cutoff = (now or timezone.now()) - log_retention()
    old = Job.objects.filter(state__in=FINAL_STATES, finished_at__lt=cutoff)
    return JobLogChunk.objects.filter(job__in=old).delete()[0]
