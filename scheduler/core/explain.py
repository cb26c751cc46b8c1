"""Sentences with numbers saying why a pending job does not start now."""

from __future__ import annotations

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


def resource_reason(job: PendingJob, cap: FreeCapacity) -> str:
    """Why the job finds no room, from what the capacity has free now."""
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
