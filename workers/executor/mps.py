"""Holding fractional GPU jobs to their share with CUDA MPS, where the host runs it.

The scheduler packs several fractional jobs on one GPU, each with a compute share
(`gpu_compute_percent`) and a memory share (`gpu_memory_mb`). Without help the GPU knows
nothing of these shares: the supervisor measures each job's memory and stops one past its
share, but compute is not limited at all. Where the host runs the CUDA Multi-Process
Service (an `nvidia-cuda-mps-control -d` daemon), a job's CUDA contexts go through the MPS
server, which honours two per-client variables:

- CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: the share of the GPU's SMs the client may use;
- CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: `<device>=<MB>M`, the device memory it may allocate
  (an allocation past it fails inside the job, as on a full GPU).

The device is the job's own CUDA ordinal: a fraction sees only its GPU
(CUDA_VISIBLE_DEVICES names one NVML index), so that GPU is device 0 to it.

A job on a MIG device (docs/mig.md) gets none of this: the slice is already a share the
hardware holds, and MPS on MIG needs a daemon of its own per MIG device, which the one
host-wide daemon probed here is not. A fraction placed on a MIG device is advisory, as on a
host without MPS (the supervisor still holds it to its memory).

The daemon is found by its pipe directory (CUDA_MPS_PIPE_DIRECTORY, default
/tmp/nvidia-mps) holding a `control` named pipe; the job gets the same
CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY, so it reaches the daemon the agent saw.
Where there is none, nothing is set and the share stays advisory; the agent's
registration says which (`Mps.note`). Standard library only.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
DEFAULT_LOG_DIRECTORY = "/var/log/nvidia-mps"
CONTROL_PIPE = "control"
# How much of the agent's enforcement string the control side stores (Node.resource_enforcement).
MAX_ENFORCEMENT_CHARS = 300
# What fleet sets for a fraction on an MPS host; a job's own values for them are dropped.
MPS_VARIABLES = (
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
)


@dataclass(frozen=True, slots=True)
class Mps:
    """Whether this host runs an MPS control daemon fleet can hand jobs to. `pipe_directory`
    is set when it does; otherwise `reason` says why not, in a sentence."""

    pipe_directory: str | None
    log_directory: str | None = None
    reason: str = ""

    @property
    def available(self) -> bool:
        return self.pipe_directory is not None

    @property
    def note(self) -> str:
        """The "mps:" part of the agent's enforcement string."""
        if self.available:
            return f"mps: {self.pipe_directory}"
        return f"mps: none: {self.reason}"


def mps_probe(env: Mapping[str, str] | None = None) -> Mps:
    """Look for the MPS control daemon's pipe directory named by CUDA_MPS_PIPE_DIRECTORY in
    `env` (default os.environ), or /tmp/nvidia-mps, and its `control` pipe."""
    source = os.environ if env is None else env
    named = source.get("CUDA_MPS_PIPE_DIRECTORY", "").strip()
    directory = named or DEFAULT_PIPE_DIRECTORY
    how = "CUDA_MPS_PIPE_DIRECTORY" if named else "the default pipe directory"
    control = Path(directory) / CONTROL_PIPE
    try:
        mode = control.stat().st_mode
    except FileNotFoundError:
        if not Path(directory).is_dir():
            why = f"{directory} ({how}) does not exist: no MPS control daemon runs on this host"
        else:
            why = f"{directory} ({how}) has no control pipe: the MPS control daemon is not running"
        return Mps(None, reason=why)
    except OSError as error:
        return Mps(None, reason=f"cannot look at {control}: {error.strerror or error}")
    if not stat.S_ISFIFO(mode):
        return Mps(None, reason=f"{control} is not a named pipe, so it is no MPS control pipe")
    log = source.get("CUDA_MPS_LOG_DIRECTORY", "").strip() or None
    return Mps(os.path.abspath(directory), log_directory=log)


def with_mps(note: str, mps: Mps) -> str:
    """The agent's enforcement string with its "mps:" part added: "cgroup-v2; mps: <pipe
    directory>", or "none: <why>; mps: none: <why>", shortened to what the control side
    stores. A job page reads "mps: /" as "fractional shares are enforced"."""
    text = f"{note}; {mps.note}"
    if len(text) > MAX_ENFORCEMENT_CHARS:
        text = text[: MAX_ENFORCEMENT_CHARS - 1] + "…"
    return text


def mps_environment(spec: Any, mps: Mps) -> dict[str, str]:
    """The MPS variables of one attempt: empty for a job that is not a fraction of one GPU,
    or on a host without MPS (its share is then advisory)."""
    if not mps.available or not spec.is_fractional or len(spec.gpu_indices) != 1:
        return {}
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe_directory)}
    if mps.log_directory:
        env["CUDA_MPS_LOG_DIRECTORY"] = mps.log_directory
    if spec.gpu_compute_percent is not None:
        percent = min(100, max(1, int(spec.gpu_compute_percent)))
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
    if spec.gpu_memory_mb is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={int(spec.gpu_memory_mb)}M"
    return env
