"""A stand-in `pynvml` module for hosts without GPUs: the one place a double is right,
since NVML itself cannot run here. It mimics the parts of nvidia-ml-py the backend uses:
error classes (NotSupported as a subclass of NVMLError), constants, and device calls."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

MB = 1024 * 1024


class NVMLError(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's own name
    def __init__(self) -> None:
        super().__init__("Not Supported")


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__("Driver Not Loaded")


@dataclass
class FakeDevice:
    name: Any
    uuid: str
    total_mb: int
    used_mb: int
    util: int = 0
    mem_util: int = 0
    temp: int = 40
    power_mw: int = 100_000
    limit_mw: int = 400_000
    sm_clock: int = 1410
    mem_clock: int = 1593
    fan: int | None = None  # None: not supported
    throttle: int = 0
    ecc: int | None = None  # None: not supported
    procs: list[tuple[int, int | None]] = field(default_factory=list)


def make_module(devices: list[FakeDevice], init_error: NVMLError | None = None) -> Any:
    mod = types.ModuleType("pynvml")
    mod.NVMLError = NVMLError
    mod.NVMLError_NotSupported = NVMLError_NotSupported
    mod.NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    mod.NVML_TEMPERATURE_GPU = 0
    mod.NVML_CLOCK_SM = 1
    mod.NVML_CLOCK_MEM = 2
    mod.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    mod.NVML_VOLATILE_ECC = 0
    mod.calls = []

    def init() -> None:
        mod.calls.append("init")
        if init_error is not None:
            raise init_error

    def clock_info(dev: FakeDevice, kind: int) -> int:
        return dev.sm_clock if kind == mod.NVML_CLOCK_SM else dev.mem_clock

    def fan(dev: FakeDevice) -> int:
        if dev.fan is None:
            raise NVMLError_NotSupported()
        return dev.fan

    def ecc(dev: FakeDevice, error_type: int, counter: int) -> int:
        if dev.ecc is None:
            raise NVMLError_NotSupported()
        return dev.ecc

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: mod.calls.append("shutdown")
    mod.nvmlDeviceGetCount = lambda: len(devices)
    mod.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    mod.nvmlDeviceGetName = lambda d: d.name
    mod.nvmlDeviceGetUUID = lambda d: d.uuid
    mod.nvmlDeviceGetMemoryInfo = lambda d: types.SimpleNamespace(
        total=d.total_mb * MB, used=d.used_mb * MB, free=(d.total_mb - d.used_mb) * MB
    )
    mod.nvmlDeviceGetUtilizationRates = lambda d: types.SimpleNamespace(
        gpu=d.util, memory=d.mem_util
    )
    mod.nvmlDeviceGetTemperature = lambda d, sensor: d.temp
    mod.nvmlDeviceGetPowerUsage = lambda d: d.power_mw
    mod.nvmlDeviceGetEnforcedPowerLimit = lambda d: d.limit_mw
    mod.nvmlDeviceGetClockInfo = clock_info
    mod.nvmlDeviceGetFanSpeed = fan
    mod.nvmlDeviceGetCurrentClocksEventReasons = lambda d: d.throttle
    mod.nvmlDeviceGetTotalEccErrors = ecc
    mod.nvmlDeviceGetComputeRunningProcesses = lambda d: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=None if mb is None else mb * MB)
        for pid, mb in d.procs
    ]
    return mod
