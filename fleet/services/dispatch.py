"""What the control side sends agents to start a job: one short message per member of each
attempt (one for a single-node job, one per node for a multi-node one)."""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from fleet.models import Job, JobMember, MemberState, Node
from fleet.services import messaging
from fleet.services.reaper import start_timeout_s
from fleet.services.releases import REPORT_MARGIN_S
from workers.fence import dispatch_token

DEFAULT_RENDEZVOUS_PORTS = "29500-29999"

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Share:
    """One member of an attempt as a start needs it: its rank, node (id, name, and the
    address peers reach it at) and GPUs."""

    rank: int
    node_id: int
    node_name: str
    host: str
    gpu_indices: tuple[int, ...]

    @classmethod
    def on(cls, rank: int, node: Node, gpu_indices: tuple[int, ...]) -> Share:
        return cls(rank, node.pk, node.name, node_address(node), gpu_indices)


@dataclass(frozen=True, slots=True)
class StartJob:
    """What a start message says of its job and attempt: the job's columns a start reads,
    its owner's user name, its team's slug, and its array task (id, index, count) if any."""

    id: int
    attempt: int
    name: str
    command: str
    env: dict[str, Any]
    workdir: str
    time_limit: int
    gpus: int
    gpu_memory_mb: int | None
    gpu_compute_percent: int | None
    cpus: int
    memory_mb: int
    assigned_at: datetime | None
    user: str
    team: str
    array: dict[str, int] | None

    @classmethod
    def of(cls, job: Job) -> StartJob:
        return cls(
            job.pk, job.attempt, job.name, job.command, job.env, job.workdir, job.time_limit,
            job.gpus, job.gpu_memory_mb, job.gpu_compute_percent, job.cpus, job.memory_mb,
            job.assigned_at, job.owner.username, job.team.slug, array_start(job),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Start:
    """One dispatched attempt's starts: the job, its members (rank 0 first) and rank 0's
    rendezvous port."""

    job: StartJob
    shares: list[Share]
    port: int


def rendezvous_ports() -> tuple[int, int]:
    """The range master ports are picked from: FLEET_RENDEZVOUS_PORTS, "LOW-HIGH"."""
    text = getattr(settings, "FLEET_RENDEZVOUS_PORTS", None) or os.environ.get(
        "FLEET_RENDEZVOUS_PORTS", DEFAULT_RENDEZVOUS_PORTS
    )
    try:
        low, high = (int(part) for part in str(text).split("-", 1))
    except ValueError as exc:
        raise ValueError(
            f"FLEET_RENDEZVOUS_PORTS is {text!r}; give a range of ports such as 29500-29999."
        ) from exc
    if not 1024 <= low <= high <= 65535:
        raise ValueError(
            f"FLEET_RENDEZVOUS_PORTS is {text!r}; give LOW-HIGH with 1024 <= LOW <= HIGH <= 65535."
        )
    return low, high


def master_port(job_id: int, attempt: int) -> int:
    """Where the search for rank 0's rendezvous port of one attempt begins: spread over the
    range by job and attempt, so jobs rarely probe the same ports first and a requeued
    attempt begins elsewhere than its predecessor (which may still hold the old one)."""
    low, high = rendezvous_ports()
    return low + zlib.crc32(f"{job_id}.{attempt}".encode()) % (high - low + 1)


def ports_in_use(*, node_id: int, now: datetime | None = None) -> set[int]:
    """Master ports of other attempts whose rank 0 is on the node and may still hold it:
    assigned or running, or stopped so recently that the process may still be in its grace
    (the window GPU holds use: grace plus the time for the end's report)."""
    return ports_in_use_many(node_ids=[node_id], now=now).get(node_id, set())


def ports_in_use_many(
    *, node_ids: Iterable[int], now: datetime | None = None
) -> dict[int, set[int]]:
    """`ports_in_use` of many nodes in one query, by node id."""
    now = now or timezone.now()
    recent = now - timedelta(seconds=float(settings.FLEET_JOB_GRACE) + REPORT_MARGIN_S)
    rows = JobMember.objects.filter(
        node_id__in=list(node_ids), rank=0, master_port__isnull=False
    ).filter(Q(state__in=(MemberState.ASSIGNED, MemberState.RUNNING)) | Q(finished_at__gte=recent))
    taken: dict[int, set[int]] = {}
    for node_id, port in rows.values_list("node_id", "master_port"):
        if port:
            taken.setdefault(node_id, set()).add(int(port))
    return taken


def _free_port(*, job_id: int, attempt: int, node_id: int, taken: set[int]) -> int:
    low, high = rendezvous_ports()
    first = master_port(job_id, attempt)
    size = high - low + 1
    for step in range(size):
        port = low + (first - low + step) % size
        if port not in taken:
            return port
    log.warning(
        "every rendezvous port of %s-%s is in use on node %s; job %s attempt %s shares port %s "
        "(widen FLEET_RENDEZVOUS_PORTS)",
        low, high, node_id, job_id, attempt, first,
    )  # fmt: skip
    return first


def master_port_choose(*, job_id: int, attempt: int, node_id: int) -> int:
    """A port of the range that no other live attempt with rank 0 on the node uses, searched
    from the attempt's own starting point. With every port taken, the starting point
    itself, and a warning: the range is too small for what runs on that node."""
    taken = ports_in_use(node_id=node_id)
    return _free_port(job_id=job_id, attempt=attempt, node_id=node_id, taken=taken)


def master_ports_choose(attempts: Iterable[tuple[int, int, int]]) -> dict[int, int]:
    """`master_port_choose` for many new attempts at once, (job id, attempt, rank 0's node
    id) each, by job id: one query for all their nodes, and no two of them given one port
    on one node. For a dispatch of many jobs, which stores each port with its rank 0
    member as it writes the members."""
    wanted = list(attempts)
    taken = ports_in_use_many(node_ids={node_id for _, _, node_id in wanted})
    ports = {}
    for job_id, attempt, node_id in wanted:
        busy = taken.setdefault(node_id, set())
        port = _free_port(job_id=job_id, attempt=attempt, node_id=node_id, taken=busy)
        busy.add(port)
        ports[job_id] = port
    return ports


def attempt_master_port(job: Job, shares: list[Share]) -> int:
    """Rank 0's port for the current attempt: the one stored with its rank 0 member, else
    chosen now and stored, so every start sent again for this attempt names the same port.
    Call inside the dispatch transaction (one scheduling cycle at a time chooses)."""
    chosen = getattr(job, "dispatched_master_port", None)
    if chosen is not None:  # chosen and stored by the dispatch that loaded this job
        return int(chosen)
    rank0 = JobMember.objects.filter(job_id=job.pk, attempt=job.attempt, rank=0)
    rows = list(rank0.values_list("master_port", flat=True)[:1])
    if not shares or not rows:
        # No member row to store it with (a job dispatched before members existed): the
        # starting point, the same at every resend.
        return master_port(job.pk, job.attempt)
    if rows[0]:
        return int(rows[0])
    port = master_port_choose(job_id=job.pk, attempt=job.attempt, node_id=shares[0].node_id)
    if not rank0.filter(master_port__isnull=True).update(master_port=port):
        stored = rank0.values_list("master_port", flat=True).first()
        return int(stored) if stored else port
    return port


def attempt_shares(job: Job) -> list[Share]:
    """The current attempt's members, rank 0 first. A single-node job has one: its own node
    and GPUs (so no query is needed for it)."""
    if not job.is_gang:
        return [] if job.node is None else [Share.on(0, job.node, tuple(job.gpu_indices or ()))]
    rows = list(
        JobMember.objects.filter(job_id=job.pk, attempt=job.attempt)
        .select_related("node")
        .order_by("rank")
    )
    return [
        Share.on(m.rank, m.node, tuple(int(i) for i in m.gpu_indices or ()))
        for m in rows
        if m.node is not None
    ]


def node_address(node: Node) -> str:
    """How peers reach the node: the address its agent registered, else its name."""
    return node.address or node.name


def start_spec(
    job: Job,
    share: Share | None = None,
    shares: list[Share] | None = None,
    port: int | None = None,
) -> dict[str, Any]:
    """The JSON spec an agent needs to run one member of this attempt (workers.executor
    JobSpec fields). Without `share`, rank 0 on the job's own node; without `port`, the
    attempt's stored master port (chosen now if it has none)."""
    if shares is None:
        shares = attempt_shares(job)
    if port is None:
        port = attempt_master_port(job, shares)
    if share is None:
        share = shares[0] if shares else Share.on(0, job.node, tuple(job.gpu_indices or ()))  # type: ignore[arg-type]
    return member_spec(StartJob.of(job), share, shares or [share], port)


def member_spec(job: StartJob, share: Share, shares: list[Share], port: int) -> dict[str, Any]:
    """`start_spec` of one member, from what the start needs of its job and members."""
    hosts = [s.host for s in shares]
    return {
        "name": job.name,
        "command": job.command,
        "env": dict(job.env or {}),
        "workdir": job.workdir or None,
        "gpu_indices": list(share.gpu_indices),
        "time_limit": job.time_limit,
        "gpu_memory_mb": job.gpu_memory_mb,
        "gpu_compute_percent": job.gpu_compute_percent,
        # Host resources this member may use on its node (0: not asked).
        "cpus": job.cpus,
        "memory_mb": job.memory_mb,
        # The control side keeps stopped jobs' GPUs reserved for this long (releases.py).
        "grace": settings.FLEET_JOB_GRACE,
        # Tells a redelivered start (same dispatch) from a new one that reuses the job id
        # and attempt (a control side whose database was reset).
        "dispatch": dispatch_token(job.assigned_at.timestamp()) if job.assigned_at else None,
        # The agent maps these to the local account the job runs as (FLEET_JOB_USER_MAP).
        "user": job.user,
        "team": job.team,
        # How the members find each other (torch.distributed and the like): the agent puts
        # MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK, ... in the job's environment.
        "rendezvous": {
            "rank": share.rank,
            "nnodes": len(hosts),
            "gpus_per_node": max(1, len(share.gpu_indices)) if job.gpus else 1,
            "world_size": job.gpus or 1,
            "master_addr": hosts[0],
            "master_port": port,
            "hosts": hosts,
        },
        # A task of a job array: the agent sets FLEET_ARRAY_JOB_ID, FLEET_ARRAY_INDEX and
        # FLEET_ARRAY_TASK_COUNT from it.
        "array": job.array,
    }


def array_start(job: Job) -> dict[str, int] | None:
    """What a task of a job array tells its agent (FLEET_ARRAY_*); None for other jobs."""
    if job.array is None or job.array_index is None:
        return None
    return {"job_id": job.array.pk, "index": job.array_index, "count": job.array.task_count}


def send_start_on_commit(job: Job, *, only_waiting: bool = False) -> None:
    """After the dispatch transition commits, ask each member's node to start its share of
    this attempt. With `only_waiting`, members that already reported their start are left
    out (a start sent again)."""
    assert job.node is not None, "dispatch sets the node before the start message is sent"
    shares = attempt_shares(job)
    if only_waiting and job.is_gang:
        started = set(
            JobMember.objects.filter(job_id=job.pk, attempt=job.attempt)
            .exclude(state=MemberState.ASSIGNED)
            .values_list("rank", flat=True)
        )
    else:
        started = set()
    port = attempt_master_port(job, shares)
    waiting = [s for s in shares if s.rank not in started]
    _send_on_commit(StartJob.of(job), shares, waiting, port, start_timeout_s())


def send_starts_on_commit(starts: Iterable[Start]) -> None:
    """`send_start_on_commit` of many attempts just dispatched (every member of each), from
    what the dispatch returned: no query, no model object."""
    ttl = start_timeout_s()
    for start in starts:
        _send_on_commit(start.job, start.shares, start.shares, start.port, ttl)


def _send_on_commit(
    job: StartJob, shares: list[Share], waiting: list[Share], port: int, ttl: float
) -> None:
    for share in waiting:
        messaging.send_to_node_on_commit(
            share.node_name,
            messaging.START_JOB_TASK,
            # A start is good only while the control side waits for it: past the start
            # timeout the reaper takes it back, and it may be dispatched elsewhere.
            ttl=ttl,
            job_id=job.id,
            attempt=job.attempt,
            spec=member_spec(job, share, shares, port),
        )
