"""Value types shared by every GPU backend: what a GPU is, and one reading of it.

Both are frozen dataclasses so a sample can cross threads and be cached without copies;
`to_dict()` gives the JSON shape the agent sends to the control side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable


class GpuBackendError(RuntimeError):
    """The backend cannot read the GPUs (NVML missing, driver not loaded, GPU lost).

    The message carries the underlying library's own text so an operator can act on it.
    """


class GpuProcess(NamedTuple):
    """A compute process on one GPU. `used_memory_mb` is None where the driver hides it."""

    pid: int
    used_memory_mb: int | None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static facts about one GPU, read once when the agent registers its node.

    `name` is what the driver reports ("NVIDIA A100-SXM4-80GB"); `model` is the short,
    normalised form the scheduler matches job constraints against ("A100-80GB").
    """

    index: int
    uuid: str
    name: str
    model: str
    memory_total_mb: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU.

    `util_percent` is the share of time a kernel ran; `memory_util_percent` is NVML's
    memory-controller utilisation (share of time device memory was read or written), not
    the used/total ratio, which is `memory_used_mb / memory_total_mb`. Fields a GPU does
    not support are None (`fan_percent` on passively cooled boards, `ecc_errors` where ECC
    is off). `ecc_errors` counts volatile uncorrected errors. `xid_errors` is reserved:
    Xid events need an NVML event set and are not read yet, so it is always None.
    `sampled_at` comes from the backend's injected clock (seconds).
    """

    index: int
    uuid: str
    util_percent: float | None
    memory_util_percent: float | None
    memory_used_mb: int | None
    memory_total_mb: int
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    fan_percent: float | None
    throttle_reasons: tuple[str, ...] = ()
    ecc_errors: int | None = None
    xid_errors: int | None = None
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)
    sampled_at: float = 0.0

    def to_dict(self, job_by_pid: Mapping[int, Any] | None = None) -> dict[str, Any]:
        """JSON-ready dict. Processes become `{"pid", "used_memory_mb"}` objects; when
        `job_by_pid` is given each one also carries `job_id` (None for processes that
        belong to no job)."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["throttle_reasons"] = list(self.throttle_reasons)
        procs = []
        for proc in self.processes:
            entry: dict[str, Any] = {"pid": proc.pid, "used_memory_mb": proc.used_memory_mb}
            if job_by_pid is not None:
                entry["job_id"] = job_by_pid.get(proc.pid)
            procs.append(entry)
        data["processes"] = procs
        return data


@runtime_checkable
class GpuBackend(Protocol):
    """Reads the GPUs of one host. `backend_name` says where readings come from."""

    backend_name: str

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...
