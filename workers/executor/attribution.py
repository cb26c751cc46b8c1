"""Which job a process belongs to, for telemetry and fractional enforcement."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import psutil


def pid_to_job(pids: Iterable[int], roots: Mapping[int, Any]) -> dict[int, Any]:
    """Map each pid in `pids` to the job whose root process is the pid itself or one of
    its ancestors. `roots` maps a root pid (a job's group leader, or its shim, to which
    orphans of the job are re-parented) to the job id. Pids that belong to no job, or
    that no longer exist, are left out."""
    found: dict[int, Any] = {}
    for pid in pids:
        if pid in roots:
            found[pid] = roots[pid]
            continue
        try:
            ancestors = psutil.Process(pid).parents()
        except psutil.Error:
            continue
        for parent in ancestors:
            if parent.pid in roots:
                found[pid] = roots[parent.pid]
                break
    return found
