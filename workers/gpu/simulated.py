"""Simulated GPUs for hosts without them (development, CI, demos, scheduler experiments).

A simulated node is declared explicitly, never chosen as a fallback:

- `FLEET_SIMULATE_GPUS="4xA100-80GB,2xV100-32GB"` (or `select_backend(simulate_spec=...)`)
  gives the node those GPUs, indexed in the order written. Known models need no size
  (`2xA100` is 80 GB); an unknown model needs one (`1xMI300-192GB`).
- `FLEET_SIM_SEED` (integer, default 0) seeds the small noise on every reading, so two
  backends with the same spec, node name, seed and clock produce the same readings.

Readings follow the jobs that run: the executor registers each job's process on its GPU
indices (`register_job_process`) and unregisters it when the job ends. A job declares the
load it puts on each of its GPUs through its own environment:

- `FLEET_SIM_UTIL`: GPU utilisation in percent (default: the job's compute fraction
  when it asked for one, else 85).
- `FLEET_SIM_MEMORY_MB`: GPU memory the process holds on each GPU (default: the job's
  memory budget when it asked for a fraction, else 20% of the GPU's memory).

Simulated GPU faults, so the health path (drain on Xid, ECC, lost GPU) runs without a GPU.
They are a simulation and are named so; nothing sets them unless asked:

- `FLEET_SIM_GPU_FAULTS="1:xid79,0:ecc2,3:lost"`: GPU 1 reports Xid 79, GPU 0 two
  uncorrectable ECC errors, GPU 3 is lost (left out of the samples, as with NVML).
- `FLEET_SIM_GPU_FAULTS_FILE=/path`: the same list, read from the file at every health
  check, so faults can be injected into a running agent (a missing file: no faults).

The process list carries the job's real PID, so process-to-job attribution and fractional
memory enforcement work as they do with NVML. Everything that comes from this backend says
so: `backend_name == "simulated"`, names start with "Simulated", UUIDs are
`SIM-<node>-<index>`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from workers.gpu.models import SimulatedGpuModel, parse_gpu_spec
from workers.gpu.types import FINDING_KINDS, GpuFinding, GpuInfo, GpuProcess, GpuSample

DEFAULT_UTIL_PERCENT = 85.0
DEFAULT_MEMORY_SHARE = 0.20
IDLE_SM_CLOCK_MHZ = 210
AMBIENT_C = 30.0


@dataclass(frozen=True, slots=True)
class SimulatedLoad:
    """What one job process puts on one GPU."""

    pid: int
    util_percent: float
    memory_mb: int


def _env_number(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return value


def declared_load(
    env: Mapping[str, str],
    *,
    memory_total_mb: int,
    gpu_memory_mb: int | None = None,
    gpu_compute_percent: int | None = None,
) -> tuple[float, int]:
    """(util_percent, memory_mb) a job declares for each of its GPUs; see the module doc.
    Raises ValueError for a value that is not a non-negative number."""
    util = _env_number(env, "FLEET_SIM_UTIL")
    if util is None:
        util = float(gpu_compute_percent) if gpu_compute_percent else DEFAULT_UTIL_PERCENT
    memory = _env_number(env, "FLEET_SIM_MEMORY_MB")
    if memory is None:
        memory = gpu_memory_mb if gpu_memory_mb else memory_total_mb * DEFAULT_MEMORY_SHARE
    return min(util, 100.0), int(memory)


def parse_faults(text: str, gpu_count: int) -> list[tuple[int, str, int | None]]:
    """`"1:xid79,0:ecc2,3:lost"` as (index, kind, code) triples. Raises ValueError with
    what to write instead."""
    faults: list[tuple[int, str, int | None]] = []
    for item in text.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        index_text, _, what = item.partition(":")
        kind = what.rstrip("0123456789")
        digits = what[len(kind) :]
        if not index_text.strip().isdigit() or kind not in FINDING_KINDS:
            raise ValueError(
                f"simulated GPU fault {item!r} is not INDEX:xidN, INDEX:eccN or INDEX:lost"
            )
        index = int(index_text)
        if index >= gpu_count:
            raise ValueError(f"simulated GPU fault {item!r}: there are {gpu_count} GPUs")
        if (kind == "lost") == bool(digits):
            raise ValueError(f"simulated GPU fault {item!r}: xid and ecc take a number, lost none")
        faults.append((index, kind, int(digits) if digits else None))
    return faults


class SimulatedGpuBackend:
    """GPUs from a spec, with readings driven by the job processes registered on them.
    Thread-safe: the executor registers processes while the sampler reads."""

    backend_name = "simulated"

    def __init__(
        self,
        spec: str | Iterable[SimulatedGpuModel],
        *,
        node_name: str,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
        faults: str = "",
        faults_file: str | None = None,
    ) -> None:
        self._gpus = parse_gpu_spec(spec) if isinstance(spec, str) else list(spec)
        self.node_name = node_name
        self._faults = parse_faults(faults, len(self._gpus))
        self._faults_file = faults_file
        self._clock = clock
        self._rng = random.Random(f"{seed}:{node_name}")
        self._lock = threading.Lock()
        self._loads: dict[int, list[SimulatedLoad]] = {i: [] for i in range(len(self._gpus))}

    def uuid(self, index: int) -> str:
        return f"SIM-{self.node_name}-{index}"

    def inventory(self) -> list[GpuInfo]:
        return [
            GpuInfo(i, self.uuid(i), f"Simulated {g.driver_name}", g.model, g.memory_total_mb)
            for i, g in enumerate(self._gpus)
        ]

    # -- load registration (called by the executor) ----------------------------------------

    def check_job_load(
        self,
        gpu_indices: Iterable[int],
        *,
        env: Mapping[str, str],
        gpu_memory_mb: int | None = None,
        gpu_compute_percent: int | None = None,
    ) -> dict[int, tuple[float, int]]:
        """The (util_percent, memory_mb) a job would put on each of its GPUs. Raises
        ValueError for an index this node lacks or a malformed FLEET_SIM_* value."""
        loads = {}
        for index in gpu_indices:
            if not 0 <= index < len(self._gpus):
                raise ValueError(
                    f"GPU {index} does not exist on simulated node {self.node_name} "
                    f"(it has {len(self._gpus)} GPUs)"
                )
            loads[index] = declared_load(
                env,
                memory_total_mb=self._gpus[index].memory_total_mb,
                gpu_memory_mb=gpu_memory_mb,
                gpu_compute_percent=gpu_compute_percent,
            )
        return loads

    def register_job_process(
        self,
        pid: int,
        gpu_indices: Iterable[int],
        *,
        env: Mapping[str, str],
        gpu_memory_mb: int | None = None,
        gpu_compute_percent: int | None = None,
    ) -> None:
        """Put the load `env` declares (see the module doc) on each GPU in `gpu_indices`,
        listed under `pid`. Raises ValueError as `check_job_load` does."""
        loads = self.check_job_load(
            gpu_indices,
            env=env,
            gpu_memory_mb=gpu_memory_mb,
            gpu_compute_percent=gpu_compute_percent,
        )
        with self._lock:
            for index, (util, memory) in loads.items():
                self._loads[index].append(SimulatedLoad(pid, util, memory))

    def unregister_job_process(self, pid: int) -> None:
        with self._lock:
            for index, loads in self._loads.items():
                self._loads[index] = [load for load in loads if load.pid != pid]

    # -- readings ---------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        """One reading per GPU; a GPU simulated as lost has none, as with NVML."""
        lost = {index for index, kind, _ in self._current_faults() if kind == "lost"}
        with self._lock:
            now = self._clock()
            return [
                self._sample_one(i, g, self._loads[i], now)
                for i, g in enumerate(self._gpus)
                if i not in lost
            ]

    def _current_faults(self) -> list[tuple[int, str, int | None]]:
        faults = list(self._faults)
        if self._faults_file:
            try:
                with open(self._faults_file) as fh:
                    text = fh.read()
            except FileNotFoundError:
                text = ""
            try:
                faults += parse_faults(text, len(self._gpus))
            except ValueError as exc:
                raise ValueError(f"{self._faults_file}: {exc}") from None
        return faults

    def health(self) -> list[GpuFinding]:
        """The simulated faults (module doc) as findings; each keeps its key while it is
        listed, so sending it every tick drains a node once."""
        findings = []
        for index, kind, code in self._current_faults():
            detail = {
                "xid": f"XID {code}",
                "ecc": f"{code} uncorrectable ECC errors",
                "lost": "GPU is lost (simulated)",
            }[kind]
            uuid = self.uuid(index)
            key = f"sim:{uuid}:{kind}" + (f":{code}" if code is not None else "")
            findings.append(GpuFinding(index, uuid, kind, code, detail, key))
        return findings

    def _noise(self, scale: float) -> float:
        return self._rng.gauss(0.0, scale)

    def _sample_one(
        self, index: int, gpu: SimulatedGpuModel, loads: list[SimulatedLoad], now: float
    ) -> GpuSample:
        profile = gpu.profile
        total = gpu.memory_total_mb
        busy = bool(loads)
        base_util = min(100.0, sum(load.util_percent for load in loads))
        util = _clamp(base_util + self._noise(1.5), 0.0, 100.0) if busy else 0.0
        mem_util = _clamp(util * 0.45 + self._noise(1.0), 0.0, 100.0) if busy else 0.0
        used = min(total, sum(load.memory_mb for load in loads))
        limit = float(profile.power_limit_w)
        power = _clamp(limit * (0.15 + 0.8 * util / 100.0) + self._noise(limit * 0.01), 0, limit)
        temperature = AMBIENT_C + 0.5 * util + self._noise(0.5)
        if busy:
            sm_clock = int(profile.sm_clock_max_mhz - abs(self._noise(15.0)))
        else:
            sm_clock = IDLE_SM_CLOCK_MHZ
        reasons: tuple[str, ...] = ()
        if not busy:
            reasons = ("gpu_idle",)
        elif power >= 0.98 * limit:
            reasons = ("sw_power_cap",)
        return GpuSample(
            index=index,
            uuid=self.uuid(index),
            util_percent=round(util, 1),
            memory_util_percent=round(mem_util, 1),
            memory_used_mb=used,
            memory_total_mb=total,
            temperature_c=round(temperature, 1),
            power_w=round(power, 1),
            power_limit_w=limit,
            sm_clock_mhz=sm_clock,
            mem_clock_mhz=profile.mem_clock_mhz,
            fan_percent=round(30.0 + 0.5 * util, 1) if profile.has_fan else None,
            throttle_reasons=reasons,
            # Data-centre boards report ECC counters; consumer boards (the ones with fans
            # here) do not support them.
            ecc_errors=None if profile.has_fan else 0,
            xid_errors=None,
            processes=tuple(
                GpuProcess(load.pid, load.memory_mb) for load in sorted(loads, key=lambda x: x.pid)
            ),
            sampled_at=now,
        )

    def close(self) -> None:
        """Nothing to release; present so callers treat every backend alike."""


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))
