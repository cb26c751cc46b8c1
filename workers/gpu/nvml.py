"""GPU readings through NVML (the `pynvml` module of the nvidia-ml-py package).

The backend never falls back to simulation: when NVML cannot be loaded or initialised it
raises `GpuBackendError` with NVML's own message, and the agent refuses to start rather
than report invented numbers for real hardware. A field a GPU does not support (fan speed
on a passively cooled board, ECC counters with ECC off) reads as None; any other NVML
failure raises `GpuBackendError` naming the GPU and the field.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

from workers.gpu.models import normalize_model
from workers.gpu.types import GpuBackendError, GpuInfo, GpuProcess, GpuSample

_BYTES_PER_MB = 1024 * 1024

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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Reads the host's GPUs through NVML. Construct once per agent; `close()` shuts NVML
    down. `clock` stamps `sampled_at` (seconds)."""

    backend_name = "nvml"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        try:
            self._nvml = importlib.import_module("pynvml")
        except ImportError as exc:
            raise GpuBackendError(
                f"cannot import pynvml ({exc}); install nvidia-ml-py, or run the agent with "
                "FLEET_SIMULATE_GPUS set to simulate GPUs"
            ) from exc
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise GpuBackendError(
                f"NVML failed to initialise: {exc}. Check that the NVIDIA driver is loaded "
                "(nvidia-smi works), or run the agent with FLEET_SIMULATE_GPUS set to "
                "simulate GPUs"
            ) from exc
        self._handles: list[Any] = []
        try:
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self._nvml.NVMLError as exc:
            self._shutdown()
            raise GpuBackendError(f"NVML cannot list the GPUs: {exc}") from exc
        self._closed = False

    # -- helpers ---------------------------------------------------------------------------

    def _optional(self, index: int, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; None when the GPU does not support the reading or hides it from us."""
        nvml = self._nvml
        unsupported = tuple(
            cls
            for cls in (
                getattr(nvml, "NVMLError_NotSupported", None),
                getattr(nvml, "NVMLError_NoPermission", None),
            )
            if cls is not None
        )
        try:
            return call(*args)
        except unsupported:
            return None
        except nvml.NVMLError as exc:
            raise GpuBackendError(f"NVML cannot read {what} of GPU {index}: {exc}") from exc

    def _required(self, index: int, what: str, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except self._nvml.NVMLError as exc:
            raise GpuBackendError(f"NVML cannot read {what} of GPU {index}: {exc}") from exc

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    # -- API -------------------------------------------------------------------------------

    def inventory(self) -> list[GpuInfo]:
        nvml = self._nvml
        gpus = []
        with self._lock:
            for index, handle in enumerate(self._handles):
                name = _text(self._required(index, "the name", nvml.nvmlDeviceGetName, handle))
                uuid = _text(self._required(index, "the UUID", nvml.nvmlDeviceGetUUID, handle))
                memory = self._required(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
                total_mb = int(memory.total // _BYTES_PER_MB)
                gpus.append(GpuInfo(index, uuid, name, normalize_model(name, total_mb), total_mb))
        return gpus

    def sample(self) -> list[GpuSample]:
        with self._lock:
            return [self._sample_one(i, h) for i, h in enumerate(self._handles)]

    def _sample_one(self, index: int, handle: Any) -> GpuSample:
        nvml = self._nvml
        opt = self._optional
        uuid = _text(self._required(index, "the UUID", nvml.nvmlDeviceGetUUID, handle))
        memory = self._required(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        rates = opt(index, "utilisation", nvml.nvmlDeviceGetUtilizationRates, handle)
        temp = opt(
            index, "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
        power_mw = opt(index, "power draw", nvml.nvmlDeviceGetPowerUsage, handle)
        limit_mw = opt(index, "power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        sm_clock = opt(index, "SM clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
        mem_clock = opt(
            index, "memory clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM
        )
        fan = opt(index, "fan speed", nvml.nvmlDeviceGetFanSpeed, handle)
        reasons_call = getattr(
            nvml,
            "nvmlDeviceGetCurrentClocksEventReasons",
            getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None),
        )
        mask = opt(index, "throttle reasons", reasons_call, handle) if reasons_call else None
        ecc = opt(
            index,
            "ECC errors",
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        procs = opt(index, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        return GpuSample(
            index=index,
            uuid=uuid,
            util_percent=float(rates.gpu) if rates is not None else None,
            memory_util_percent=float(rates.memory) if rates is not None else None,
            memory_used_mb=int(memory.used // _BYTES_PER_MB),
            memory_total_mb=int(memory.total // _BYTES_PER_MB),
            temperature_c=float(temp) if temp is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
            sm_clock_mhz=int(sm_clock) if sm_clock is not None else None,
            mem_clock_mhz=int(mem_clock) if mem_clock is not None else None,
            fan_percent=float(fan) if fan is not None else None,
            throttle_reasons=throttle_reason_names(mask) if mask is not None else (),
            ecc_errors=int(ecc) if ecc is not None else None,
            xid_errors=None,
            processes=tuple(
                GpuProcess(
                    int(p.pid),
                    int(p.usedGpuMemory // _BYTES_PER_MB) if p.usedGpuMemory is not None else None,
                )
                for p in procs
            ),
            sampled_at=self._clock(),
        )

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._shutdown()
