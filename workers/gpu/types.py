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

    A MIG device offered as a GPU (docs/mig.md) has a "MIG-..." `uuid`, its own memory, a
    model naming the slice ("A100-80GB MIG 3g.40gb"), `mig_parent` (the NVML index of the
    GPU it is part of), `mig_profile` ("3g.40gb") and `compute_slices` (the compute slices
    of its compute instance, of the 7 an A100 or H100 has, where NVML tells them).
    """

    index: int
    uuid: str
    name: str
    model: str
    memory_total_mb: int
    mig_parent: int | None = None
    mig_profile: str = ""
    compute_slices: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU.

    `util_percent` is the share of time a kernel ran; `memory_util_percent` is NVML's
    memory-controller utilisation (share of time device memory was read or written), not
    the used/total ratio, which is `memory_used_mb / memory_total_mb`. Fields a GPU does
    not support are None (`fan_percent` on passively cooled boards, `ecc_errors` where ECC
    is off). `ecc_errors` counts volatile uncorrected errors. `xid_errors` stays None: Xid
    events are read from an NVML event set and sent as health findings (`GpuFinding`).
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


# What a health finding says of a GPU: an Xid event the driver raised, uncorrectable ECC
# errors since the driver loaded, or the GPU gone from the bus (NVML: GPU is lost).
FINDING_KINDS = ("xid", "ecc", "lost")


@dataclass(frozen=True, slots=True)
class GpuFinding:
    """Something wrong with one GPU that the control side acts on (fleet/services/gpu_health).

    `code` is the Xid number for "xid" and the count of volatile uncorrected errors for
    "ecc" (None for "lost"); `detail` is the text an operator reads ("XID 79").
    `key` names this finding for good: the agent sends its findings again every tick and
    after a restart, and the control side acts on a key once, so a node that staff resumed
    is not drained again for a finding it has already seen. It holds the host's boot id,
    because volatile ECC counts and lost GPUs last until the driver reloads.
    """

    index: int
    uuid: str
    kind: str
    code: int | None
    detail: str
    key: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class GpuBackend(Protocol):
    """Reads the GPUs of one host. `backend_name` says where readings come from."""

    backend_name: str

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def host_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel's id of this boot of the host ("" where it has none): findings that last
    until the driver reloads are named with it (`GpuFinding.key`)."""
    try:
        with open(path) as fh:
            return fh.read().strip()[:40]
    except OSError:
        return ""
