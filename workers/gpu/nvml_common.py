"""What the NVML backend's parts share: NVML's strings, process lists and the lost-GPU
error."""

from __future__ import annotations

from typing import Any

from workers.gpu.types import GpuBackendError, GpuProcess

BYTES_PER_MB = 1024 * 1024


def nvml_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_processes(procs: Any) -> tuple[GpuProcess, ...]:
    return tuple(
        GpuProcess(
            int(p.pid),
            int(p.usedGpuMemory // BYTES_PER_MB) if p.usedGpuMemory is not None else None,
        )
        for p in procs
    )


class GpuLost(GpuBackendError):
    """NVML says the GPU is lost: it has fallen off the bus (Xid 79) or stopped answering."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
