"""A stand-in `pynvml` module for hosts without GPUs: the one place a double is right,
since NVML itself cannot run here. It mimics the parts of nvidia-ml-py the backend uses:
error classes (NotSupported, NotFound, ... as subclasses of NVMLError, each with NVML's
return code in `value`), constants, and device calls, including the MIG ones
(nvmlDeviceGetMigMode returns [current, pending]; nvmlDeviceGetMigDeviceHandleByIndex
raises NotFound for an empty slot; on a MIG device handle nvmlDeviceGetUtilizationRates
raises NotSupported, as NVML documents for MIG-enabled GPUs)."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

MB = 1024 * 1024

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10


class NVMLError(Exception):
    value: int | None = None

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's own name
    value = NVML_ERROR_NOT_SUPPORTED

    def __init__(self) -> None:
        super().__init__("Not Supported")


class NVMLError_NotFound(NVMLError):  # noqa: N801
    value = NVML_ERROR_NOT_FOUND

    def __init__(self) -> None:
        super().__init__("Not Found")


class NVMLError_Timeout(NVMLError):  # noqa: N801
    value = NVML_ERROR_TIMEOUT

    def __init__(self) -> None:
        super().__init__("Timeout")


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
    value = NVML_ERROR_DRIVER_NOT_LOADED

    def __init__(self) -> None:
        super().__init__("Driver Not Loaded")


@dataclass
class FakeMigDevice:
    """One MIG device (a compute instance of a GPU instance). `gi_slices` and `ci_slices`
    are what nvmlDeviceGetAttributes reports as gpuInstanceSliceCount and
    computeInstanceSliceCount."""

    name: Any
    uuid: str
    total_mb: int
    used_mb: int
    gi_slices: int = 1
    ci_slices: int = 1
    procs: list[tuple[int, int | None]] = field(default_factory=list)


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
    mig_mode: int | None = 0  # current MIG mode; None: not supported (a GPU before Ampere)
    mig_slots: list[FakeMigDevice | None] = field(default_factory=list)  # None: empty slot
    max_mig: int = 7


def make_module(
    devices: list[FakeDevice], init_error: NVMLError | None = None, *, events: bool = False
) -> Any:
    """The module over `devices`. With `events`, it has NVML's event set calls too: append
    `xid_event(device, code)` to `mod.events` for the driver to raise it."""
    mod: Any = types.ModuleType("pynvml")
    mod.NVMLError = NVMLError
    mod.NVMLError_NotSupported = NVMLError_NotSupported
    mod.NVMLError_NotFound = NVMLError_NotFound
    mod.NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    mod.NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    mod.NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    mod.NVML_TEMPERATURE_GPU = 0
    mod.NVML_CLOCK_SM = 1
    mod.NVML_CLOCK_MEM = 2
    mod.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    mod.NVML_VOLATILE_ECC = 0
    mod.NVML_DEVICE_MIG_DISABLE = 0
    mod.NVML_DEVICE_MIG_ENABLE = 1
    mod.calls = []

    def init() -> None:
        mod.calls.append("init")
        if init_error is not None:
            raise init_error

    def physical(call: Any) -> Any:
        """A reading of the board (temperature, power, clocks, ...): not one a MIG device
        handle answers here, so a backend that asks one gets NotSupported."""

        def read(dev: Any, *args: Any) -> Any:
            if isinstance(dev, FakeMigDevice):
                raise NVMLError_NotSupported()
            return call(dev, *args)

        return read

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

    def utilization(dev: Any) -> Any:
        if isinstance(dev, FakeMigDevice):
            raise NVMLError_NotSupported()
        return types.SimpleNamespace(gpu=dev.util, memory=dev.mem_util)

    def mig_mode(dev: Any) -> list[int]:
        if isinstance(dev, FakeMigDevice) or dev.mig_mode is None:
            raise NVMLError_NotSupported()
        return [dev.mig_mode, dev.mig_mode]

    def max_mig(dev: Any) -> int:
        if isinstance(dev, FakeMigDevice) or dev.mig_mode is None:
            raise NVMLError_NotSupported()
        return dev.max_mig

    def mig_handle(dev: Any, index: int) -> FakeMigDevice:
        if isinstance(dev, FakeMigDevice) or dev.mig_mode != 1:
            raise NVMLError_NotSupported()
        slot = dev.mig_slots[index] if index < len(dev.mig_slots) else None
        if slot is None:
            raise NVMLError_NotFound()
        return slot

    def attributes(dev: Any) -> Any:
        if not isinstance(dev, FakeMigDevice):
            raise NVMLError_NotSupported()
        return types.SimpleNamespace(
            multiprocessorCount=14 * dev.ci_slices,
            gpuInstanceSliceCount=dev.gi_slices,
            computeInstanceSliceCount=dev.ci_slices,
            memorySizeMB=dev.total_mb,
        )

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: mod.calls.append("shutdown")
    mod.nvmlDeviceGetCount = lambda: len(devices)
    mod.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    mod.nvmlDeviceGetName = lambda d: d.name
    mod.nvmlDeviceGetUUID = lambda d: d.uuid
    mod.nvmlDeviceGetMemoryInfo = lambda d: types.SimpleNamespace(
        total=d.total_mb * MB, used=d.used_mb * MB, free=(d.total_mb - d.used_mb) * MB
    )
    mod.nvmlDeviceGetUtilizationRates = utilization
    mod.nvmlDeviceGetTemperature = physical(lambda d, sensor: d.temp)
    mod.nvmlDeviceGetPowerUsage = physical(lambda d: d.power_mw)
    mod.nvmlDeviceGetEnforcedPowerLimit = physical(lambda d: d.limit_mw)
    mod.nvmlDeviceGetClockInfo = physical(clock_info)
    mod.nvmlDeviceGetFanSpeed = physical(fan)
    mod.nvmlDeviceGetCurrentClocksEventReasons = physical(lambda d: d.throttle)
    mod.nvmlDeviceGetTotalEccErrors = physical(ecc)
    mod.nvmlDeviceGetComputeRunningProcesses = lambda d: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=None if mb is None else mb * MB)
        for pid, mb in d.procs
    ]
    mod.nvmlDeviceGetMigMode = mig_mode
    mod.nvmlDeviceGetMaxMigDeviceCount = max_mig
    mod.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    mod.nvmlDeviceGetAttributes = attributes
    if events:
        mod.NVMLError_Timeout = NVMLError_Timeout
        mod.NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
        mod.nvmlEventTypeXidCriticalError = XID_CRITICAL_ERROR
        mod.events = []

        def wait(event_set: Any, timeout_ms: int) -> Any:
            if not mod.events:
                raise NVMLError_Timeout()
            return mod.events.pop(0)

        mod.nvmlEventSetCreate = lambda: "event-set"
        mod.nvmlDeviceRegisterEvents = lambda handle, mask, event_set: None
        mod.nvmlEventSetWait_v2 = wait
        mod.nvmlEventSetFree = lambda event_set: None
    return mod


XID_CRITICAL_ERROR = 0x8


def xid_event(device: Any, code: int) -> Any:
    """An Xid event as nvmlEventSetWait_v2 returns it (eventType, eventData, device)."""
    return types.SimpleNamespace(device=device, eventType=XID_CRITICAL_ERROR, eventData=code)
