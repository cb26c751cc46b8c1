"""Shaping GPU samples into the telemetry message an agent sends each tick.

Pure: no Django, no Celery. The agent's task does, each tick::

    samples = backend.sample()
    owners = supervisor.pid_to_job(p.pid for s in samples for p in s.processes)
    send(telemetry_payload(node_name=..., backend_name=backend.backend_name,
                           samples=samples, job_by_pid=owners))
    supervisor.enforce_gpu_memory(samples)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workers.gpu.types import GpuSample

PAYLOAD_VERSION = 1


def job_gpu_usage(
    samples: Sequence[GpuSample], job_by_pid: Mapping[int, Any]
) -> dict[Any, dict[str, Any]]:
    """Per job: GPU memory its processes hold (MB, summed over GPUs) and the GPU indices
    they are on. Processes whose memory the driver hides count as 0 MB."""
    usage: dict[Any, dict[str, Any]] = {}
    for sample in samples:
        for proc in sample.processes:
            if proc.pid not in job_by_pid:
                continue
            entry = usage.setdefault(job_by_pid[proc.pid], {"memory_mb": 0, "gpu_indices": []})
            entry["memory_mb"] += proc.used_memory_mb or 0
            if sample.index not in entry["gpu_indices"]:
                entry["gpu_indices"].append(sample.index)
    return usage


def telemetry_payload(
    *,
    node_name: str,
    backend_name: str,
    samples: Sequence[GpuSample],
    job_by_pid: Mapping[int, Any],
) -> dict[str, Any]:
    """The JSON message for one tick: node, backend ("nvml" or "simulated", so simulated
    readings are never mistaken for real ones), one entry per GPU with its processes tagged
    by job, and the per-job usage. `sampled_at` is the latest GPU reading's time."""
    return {
        "version": PAYLOAD_VERSION,
        "node": node_name,
        "backend": backend_name,
        "sampled_at": max((s.sampled_at for s in samples), default=None),
        "gpus": [s.to_dict(job_by_pid) for s in samples],
        "jobs": {
            str(job_id): usage for job_id, usage in job_gpu_usage(samples, job_by_pid).items()
        },
    }
