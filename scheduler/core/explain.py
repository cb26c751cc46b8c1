"""Sentences with numbers saying why a pending job does not start now."""

from __future__ import annotations

from scheduler.core._capacity_index import host_request, node_count, per_node_gpus
from scheduler.core.admission import megabytes
from scheduler.core.model import PendingJob, Snapshot
from scheduler.core.placement import FreeCapacity
from scheduler.core.quota import QuotaLedger


def _kind_words(job: PendingJob) -> str:
    words = []
    if job.gpu_model:
        words.append(job.gpu_model)
    if job.min_gpu_memory_mb:
        words.append(f"with at least {job.min_gpu_memory_mb} MB")
    return " ".join(words)


def _host_short(job: PendingJob, cap: FreeCapacity, node: str) -> str | None:
    """'it has 2 of the 8 CPUs this job needs' when the node's free host CPUs or memory
    fall short of the job's, else None."""
    cpus, memory_mb = host_request(job)
    free_cpus, free_mem = cap.host_free(node)
    if cpus and free_cpus is not None and free_cpus < cpus:
        return f"it has {free_cpus} of the {cpus} CPUs this job needs"
    if memory_mb and free_mem is not None and free_mem < memory_mb:
        return (
            f"it has {megabytes(free_mem)} of the {megabytes(memory_mb)} of host memory "
            "this job needs"
        )
    return None


def _gang_reason(job: PendingJob, cap: FreeCapacity) -> str:
    need, per = node_count(job), per_node_gpus(job)
    model = f" {job.gpu_model}" if job.gpu_model else ""
    text = f"needs {need} nodes with {per}{model} GPU{'s' if per != 1 else ''} each"
    if job.same_group:
        text += " in one topology group"
    ready, with_host, in_group = cap.member_room(job)
    if ready < need:
        return f"{text}; {ready} node{'s' if ready != 1 else ''} have that many free now"
    if with_host < need:
        return (
            f"{text}; {ready} nodes have the GPUs free but only {with_host} also have the "
            "host CPUs and memory it asks for"
        )
    return f"{text}; at most {in_group} such nodes are free in one topology group"


def resource_reason(job: PendingJob, cap: FreeCapacity) -> str:
    """Why the job finds no room, from what the capacity has free now."""
    if job.gpus and node_count(job) > 1:
        return _gang_reason(job, cap)
    if (job.cpus or job.memory_mb) and cap.host_limited():
        spot = cap.best_fit_ignoring_host(job)
        short = None if spot is None else _host_short(job, cap, spot[0])
        if spot is not None and short is not None:
            node = spot[0]
            if job.gpus:
                free = len(cap.whole_free(node))
                return f"{free} GPU{'s are' if free != 1 else ' is'} free on {node} but {short}"
            return f"GPU {spot[1][0]} on {node} has room but {short}"
    if job.gpus:
        model = f" {job.gpu_model}" if job.gpu_model else ""
        extra = f" with at least {job.min_gpu_memory_mb} MB" if job.min_gpu_memory_mb else ""
        need = f"needs {job.gpus}{model} GPU{'s' if job.gpus != 1 else ''}{extra} on one node"
        block, where = cap.largest_free_block_for(job)
        if where is None:
            return f"{need}; no suitable GPU is free"
        return f"{need}; the largest free block is {block} on {where}"
    mem, comp = job.gpu_memory_mb or 0, job.gpu_compute_percent or 0
    kind = _kind_words(job)
    need = f"needs {mem} MB and {comp} % of one {kind + ' ' if kind else ''}GPU"
    most = cap.most_free_fraction(job)
    if most is None:
        return f"{need}; no suitable GPU has room"
    free_mem, free_comp, node, index = most
    return f"{need}; the roomiest has {free_mem} MB and {free_comp} % free ({node} GPU {index})"


def why_waiting(job: PendingJob, cap: FreeCapacity, snapshot: Snapshot, quota: QuotaLedger) -> str:
    """Quota first (it holds the job whatever is free), then resources, with team usage."""
    del snapshot  # the capacity and ledger already carry what the sentence needs
    limit = quota.check(job)
    if limit is not None:
        return limit
    return f"{resource_reason(job, cap)}; {quota.describe(job.team)}"
