"""What the NVML backend's parts share: NVML's strings, process lists, throttle reason
names and the lost-GPU error."""

from __future__ import annotations

from typing import Any

from workers.gpu.types import GpuBackendError, GpuProcess

BYTES_PER_MB = 1024 * 1024

# NVML's clock-event (throttle) reason bits, named as operators read them.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def throttle_reason_names(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in THROTTLE_REASONS if mask & bit)


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
