"""GPU readings through NVML (the `pynvml` module of the nvidia-ml-py package).

The backend never falls back to simulation: when NVML cannot be loaded or initialised it
raises `GpuBackendError` with NVML's own message, and the agent refuses to start rather
than report invented numbers for real hardware. A field a GPU does not support (fan speed
on a passively cooled board, ECC counters with ECC off) reads as None; any other NVML
failure raises `GpuBackendError` naming the GPU and the field.

Health (`health()`): Xid events come from an NVML event set registered for
`nvmlEventTypeXidCriticalError` on every GPU that supports it, drained without waiting
(`nvmlEventSetWait_v2(set, 0)`) each tick; uncorrectable ECC errors are the volatile
uncorrected count (`nvmlDeviceGetTotalEccErrors`), reported while above zero; a GPU whose
NVML calls fail with `NVML_ERROR_GPU_IS_LOST` has fallen off the bus: it is left out of
the samples and reported lost from then on.

MIG (docs/mig.md): a GPU whose current MIG mode is enabled (`nvmlDeviceGetMigMode`) cannot
run CUDA work as a whole, so it is not offered whole; each of its MIG devices
(`nvmlDeviceGetMigDeviceHandleByIndex` up to `nvmlDeviceGetMaxMigDeviceCount`) is offered as
a GPU of its own instead, with its "MIG-..." UUID, its own memory and a model that names the
slice ("A100-80GB MIG 3g.40gb"). MIG device `slot` of GPU `i` gets the index
`GPU count + i * MIG_SLOTS + slot`: after every whole GPU, unique on the node and unchanged
when another GPU's MIG layout changes. `mig_devices` maps those indices to the UUIDs a job
is given in CUDA_VISIBLE_DEVICES. A GPU whose MIG mode query fails (NOT_SUPPORTED before
Ampere) is a whole GPU. Per MIG device NVML gives memory and processes; utilisation is not
available (NVML: NOT_SUPPORTED on MIG-enabled GPUs) and reads as unknown (None);
temperature, clocks, fan and throttle reasons are the board's, read on the parent GPU; power
and ECC counts are the whole board's and are left out of the slice's samples (ECC errors,
Xid events and a lost board are reported as findings on each of its MIG devices).
`use_mig=False` (FLEET_MIG=off) leaves GPUs in MIG mode out altogether.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from workers.gpu.models import normalize_model
from workers.gpu.nvml_common import (
    BYTES_PER_MB,
    GpuLost,
    gpu_processes,
    nvml_text,
    throttle_reason_names,
)
from workers.gpu.nvml_mig import MigDevice, MigReading
from workers.gpu.types import (
    GpuBackendError,
    GpuFinding,
    GpuInfo,
    GpuSample,
    host_boot_id,
)

logger = logging.getLogger(__name__)

MAX_XID_FINDINGS = 64  # Xid events kept (and sent again every tick) per agent process
MAX_EVENTS_PER_TICK = 256  # events drained from the set in one tick; the rest wait


class NvmlBackend(MigReading):
    """Reads the host's GPUs through NVML. Construct once per agent; `close()` shuts NVML
    down. `clock` stamps `sampled_at` (seconds)."""

    backend_name = "nvml"

    def __init__(self, *, clock: Callable[[], float] = time.time, use_mig: bool = True) -> None:
        self._clock = clock
        self._use_mig = use_mig
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
        self._boot = host_boot_id()
        self._uuids: dict[int, str] = {}
        self._lost: dict[int, str] = {}
        self._listed: dict[int, GpuInfo] = {}
        self._xids: list[GpuFinding] = []
        for index, handle in enumerate(self._handles):
            try:
                self._uuids[index] = nvml_text(self._nvml.nvmlDeviceGetUUID(handle))
            except self._nvml.NVMLError as exc:
                if self._is_lost(exc):
                    self._lost[index] = str(exc)
        self._mig_parents: set[int] = set()  # GPUs in MIG mode: never offered whole
        self._migs: list[MigDevice] = []
        self._find_mig_devices()
        self._events = self._event_set()

    @property
    def mig_devices(self) -> Mapping[int, str]:
        """Index -> UUID ("MIG-...") of each MIG device offered: what CUDA_VISIBLE_DEVICES
        names for a job placed on it."""
        return {m.index: self._uuids[m.index] for m in self._migs if m.index in self._uuids}

    def _code(self, exc: BaseException, name: str) -> bool:
        code = getattr(self._nvml, name, None)
        return code is not None and getattr(exc, "value", None) == code

    def _is_lost(self, exc: BaseException) -> bool:
        code = getattr(self._nvml, "NVML_ERROR_GPU_IS_LOST", None)
        return code is not None and getattr(exc, "value", None) == code

    def _event_set(self) -> Any:
        """An event set for Xid errors on every GPU that supports them; None where NVML
        offers none (then Xid events are not read, and the log says so once)."""
        nvml = self._nvml
        xid = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        if xid is None or not hasattr(nvml, "nvmlEventSetCreate"):
            logger.warning("this NVML has no Xid events; Xid errors are not watched")
            return None
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            logger.warning("NVML cannot create an event set (%s); Xid errors are not watched", exc)
            return None
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, xid, events)
            except nvml.NVMLError as exc:
                if self._is_lost(exc):
                    self._lost.setdefault(index, str(exc))
                logger.warning("Xid errors of GPU %d are not watched: %s", index, exc)
        return events

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
            raise self._error(index, what, exc) from exc

    def _required(self, index: int, what: str, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except self._nvml.NVMLError as exc:
            raise self._error(index, what, exc) from exc

    def _error(self, index: int, what: str, exc: Exception) -> GpuBackendError:
        message = f"NVML cannot read {what} of GPU {index}: {exc}"
        return GpuLost(index, message) if self._is_lost(exc) else GpuBackendError(message)

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    # -- API -------------------------------------------------------------------------------

    def inventory(self) -> list[GpuInfo]:
        """The host's GPUs. A GPU lost since it was last listed keeps its entry (the node
        keeps the GPU and its history; the health finding says it is lost); one lost before
        it could be read is left out, so the agent still registers the others."""
        nvml = self._nvml
        gpus = []
        with self._lock:
            for index, handle in enumerate(self._handles):
                if index in self._mig_parents:
                    continue
                if index in self._lost:
                    if index in self._listed:
                        gpus.append(self._listed[index])
                    continue
                try:
                    name = nvml_text(
                        self._required(index, "the name", nvml.nvmlDeviceGetName, handle)
                    )
                    uuid = nvml_text(
                        self._required(index, "the UUID", nvml.nvmlDeviceGetUUID, handle)
                    )
                    memory = self._required(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
                except GpuLost as exc:
                    self._lost[index] = str(exc.__cause__ or exc)
                    continue
                total_mb = int(memory.total // BYTES_PER_MB)
                info = GpuInfo(index, uuid, name, normalize_model(name, total_mb), total_mb)
                self._listed[index] = info
                gpus.append(info)
            for mig in self._migs:
                if mig.parent not in self._lost:
                    try:
                        self._listed[mig.index] = self._mig_info(mig)
                    except GpuLost as exc:
                        self._lost[mig.parent] = str(exc.__cause__ or exc)
                if mig.index in self._listed:
                    gpus.append(self._listed[mig.index])
        return gpus

    def sample(self) -> list[GpuSample]:
        """One reading per GPU; a lost GPU has none (it is reported by `health()`)."""
        samples = []
        with self._lock:
            for index, handle in enumerate(self._handles):
                if index in self._lost or index in self._mig_parents:
                    continue
                try:
                    samples.append(self._sample_one(index, handle))
                except GpuLost as exc:
                    self._lost[index] = str(exc.__cause__ or exc)
            for mig in self._migs:
                if mig.parent in self._lost:
                    continue
                try:
                    samples.append(self._sample_mig(mig))
                except GpuLost as exc:
                    self._lost[mig.parent] = str(exc.__cause__ or exc)
        return samples

    def health(self) -> list[GpuFinding]:
        """What is wrong with the GPUs now: every lost GPU, every GPU with uncorrectable
        ECC errors since the driver loaded, and the Xid events this agent has read (the
        newest MAX_XID_FINDINGS). Sent every tick; the control side acts on each once."""
        nvml = self._nvml
        with self._lock:
            self._read_events()
            findings: list[GpuFinding] = []
            for index, handle in enumerate(self._handles):
                if index not in self._lost:
                    try:
                        ecc = self._optional(
                            index,
                            "ECC errors",
                            nvml.nvmlDeviceGetTotalEccErrors,
                            handle,
                            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                            nvml.NVML_VOLATILE_ECC,
                        )
                    except GpuLost as exc:
                        self._lost[index] = str(exc.__cause__ or exc)
                    except GpuBackendError as exc:
                        logger.warning("%s", exc)
                    else:
                        if ecc:
                            findings.extend(self._finding(
                                target, "ecc", int(ecc),
                                f"{int(ecc)} uncorrectable ECC errors", f"ecc:{int(ecc)}",
                            ) for target in self._targets(index))  # fmt: skip
                if index in self._lost:
                    findings.extend(self._finding(
                        target, "lost", None, f"GPU is lost: {self._lost[index]}", "lost"
                    ) for target in self._targets(index))  # fmt: skip
            return self._xids + findings

    def _finding(
        self, index: int, kind: str, code: int | None, detail: str, what: str
    ) -> GpuFinding:
        uuid = self._uuids.get(index, "")
        return GpuFinding(index, uuid, kind, code, detail[:200], f"{self._boot}:{uuid}:{what}")

    def _read_events(self) -> None:
        """Drain the event set without waiting; each Xid event becomes a finding."""
        nvml = self._nvml
        if self._events is None:
            return
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        # A GPU's own UUID, or a MIG device's where NVML names the MIG device in the event.
        by_uuid = {uuid: index for index, uuid in self._uuids.items()}
        for _ in range(MAX_EVENTS_PER_TICK):
            try:
                event = wait(self._events, 0)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != getattr(nvml, "NVML_ERROR_TIMEOUT", None):
                    logger.warning("reading Xid events failed: %s", exc)
                return
            if not event.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                uuid = nvml_text(nvml.nvmlDeviceGetUUID(event.device))
            except nvml.NVMLError:
                uuid = ""
            index = by_uuid.get(uuid, -1)
            if index < 0:
                logger.warning("Xid %s on a GPU this agent does not know", event.eventData)
                continue
            code = int(event.eventData)
            logger.error("GPU %d (%s) reported XID %d", index, uuid, code)
            for target in self._targets(index):
                seen = sum(1 for f in self._xids if f.index == target)
                finding = self._finding(
                    target, "xid", code, f"XID {code}", f"xid:{code}:{self._clock():.6f}:{seen}"
                )
                self._xids = [*self._xids, finding][-MAX_XID_FINDINGS:]

    def _sample_one(self, index: int, handle: Any) -> GpuSample:
        nvml = self._nvml
        opt = self._optional
        uuid = nvml_text(self._required(index, "the UUID", nvml.nvmlDeviceGetUUID, handle))
        memory = self._required(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        rates = opt(index, "utilisation", nvml.nvmlDeviceGetUtilizationRates, handle)
        board = self._board(index, handle)
        power_mw = opt(index, "power draw", nvml.nvmlDeviceGetPowerUsage, handle)
        limit_mw = opt(index, "power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
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
            memory_used_mb=int(memory.used // BYTES_PER_MB),
            memory_total_mb=int(memory.total // BYTES_PER_MB),
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None,
            ecc_errors=int(ecc) if ecc is not None else None,
            xid_errors=None,
            processes=gpu_processes(procs),
            sampled_at=self._clock(),
            **board,
        )

    def _board(self, index: int, handle: Any) -> dict[str, Any]:
        """The readings of the board itself: temperature, clocks, fan, throttle reasons."""
        nvml = self._nvml
        opt = self._optional
        temp = opt(
            index, "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
        )
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
        return {
            "temperature_c": float(temp) if temp is not None else None,
            "sm_clock_mhz": int(sm_clock) if sm_clock is not None else None,
            "mem_clock_mhz": int(mem_clock) if mem_clock is not None else None,
            "fan_percent": float(fan) if fan is not None else None,
            "throttle_reasons": throttle_reason_names(mask) if mask is not None else (),
        }

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._events is not None:
                    try:
                        self._nvml.nvmlEventSetFree(self._events)
                    except self._nvml.NVMLError:
                        pass
                self._shutdown()
