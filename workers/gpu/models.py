"""Known GPU models, the simulated-fleet spec (`4xA100-80GB,2xV100-32GB`) and the
normalisation of driver names ("NVIDIA A100-SXM4-80GB") to short model names ("A100-80GB").

Real and simulated nodes report the same short names, so a job that asks for `A100-80GB`
is placed the same way in a simulation as on real hardware.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MB_PER_GB = 1024
MAX_GPUS_PER_NODE = 64


class GpuSpecError(ValueError):
    """A simulated-GPU spec that cannot be parsed; the message says what to write instead."""


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What a simulation needs to make plausible readings for one GPU family."""

    family: str
    memory_gb: tuple[int, ...]  # known sizes; the first is the default
    driver_name: str  # NVML-style name; "{gb}" is replaced by the memory size
    power_limit_w: float
    sm_clock_max_mhz: int
    mem_clock_mhz: int
    has_fan: bool = False


_PROFILES = (
    ModelProfile("A100", (80, 40), "NVIDIA A100-SXM4-{gb}GB", 400, 1410, 1593),
    ModelProfile("H100", (80, 94), "NVIDIA H100 80GB HBM3", 700, 1980, 2619),
    ModelProfile("H200", (141,), "NVIDIA H200", 700, 1980, 3201),
    ModelProfile("V100", (32, 16), "Tesla V100-SXM2-{gb}GB", 300, 1530, 877),
    ModelProfile("P100", (16, 12), "Tesla P100-PCIE-{gb}GB", 250, 1480, 715),
    ModelProfile("T4", (16,), "Tesla T4", 70, 1590, 5001),
    ModelProfile("A10", (24,), "NVIDIA A10", 150, 1695, 6251),
    ModelProfile("A40", (48,), "NVIDIA A40", 300, 1740, 7251),
    ModelProfile("L4", (24,), "NVIDIA L4", 72, 2040, 6251),
    ModelProfile("L40S", (48,), "NVIDIA L40S", 350, 2520, 9001),
    ModelProfile("A6000", (48,), "NVIDIA RTX A6000", 300, 1800, 8001, has_fan=True),
    ModelProfile("RTX3090", (24,), "NVIDIA GeForce RTX 3090", 350, 1695, 9751, has_fan=True),
    ModelProfile("RTX4090", (24,), "NVIDIA GeForce RTX 4090", 450, 2520, 10501, has_fan=True),
)
KNOWN_MODELS: dict[str, ModelProfile] = {p.family: p for p in _PROFILES}

# Used for a model the table does not know (given with an explicit -NNGB suffix).
_GENERIC = ModelProfile("GPU", (16,), "{family}-{gb}GB", 300, 1500, 1500)


@dataclass(frozen=True, slots=True)
class SimulatedGpuModel:
    """One GPU type in a simulated node: short model name, memory and its profile."""

    model: str
    memory_gb: int
    profile: ModelProfile

    @property
    def memory_total_mb(self) -> int:
        return self.memory_gb * MB_PER_GB

    @property
    def driver_name(self) -> str:
        return self.profile.driver_name.format(gb=self.memory_gb, family=self.model)


_TOKEN = re.compile(r"^(?:(\d+)\s*[xX]\s*)?([A-Za-z][A-Za-z0-9]*?)(?:-(\d+)\s*GB)?$", re.I)


def parse_gpu_spec(spec: str) -> list[SimulatedGpuModel]:
    """Parse `"4xA100-80GB,2xV100-32GB"` into one entry per GPU, in index order.

    A count defaults to 1; a known model may omit its memory (`2xA100` is 80 GB); an
    unknown model is accepted only with an explicit size (`1xMI300-192GB`).
    """
    if not spec or not spec.strip():
        raise GpuSpecError("empty GPU spec; write e.g. '4xA100-80GB,2xV100-32GB'")
    gpus: list[SimulatedGpuModel] = []
    for raw in spec.split(","):
        token = raw.strip()
        match = _TOKEN.match(token)
        if not match:
            raise GpuSpecError(
                f"cannot read {token!r} in GPU spec {spec!r}; write COUNTxMODEL[-NNGB], "
                "e.g. '4xA100-80GB'"
            )
        count = int(match.group(1)) if match.group(1) else 1
        family = match.group(2).upper()
        size = int(match.group(3)) if match.group(3) else None
        if count < 1:
            raise GpuSpecError(f"{token!r}: the GPU count must be at least 1")
        if size is not None and size < 1:
            raise GpuSpecError(f"{token!r}: the memory size must be at least 1 GB")
        profile = KNOWN_MODELS.get(family)
        if profile is None:
            if size is None:
                known = ", ".join(sorted(KNOWN_MODELS))
                raise GpuSpecError(
                    f"unknown GPU model {match.group(2)!r}; known models are {known}, "
                    f"or give the memory explicitly, e.g. '{match.group(2)}-24GB'"
                )
            profile = _GENERIC
        gb = size if size is not None else profile.memory_gb[0]
        gpus.extend(SimulatedGpuModel(f"{family}-{gb}GB", gb, profile) for _ in range(count))
    if len(gpus) > MAX_GPUS_PER_NODE:
        raise GpuSpecError(
            f"GPU spec {spec!r} has {len(gpus)} GPUs; a node holds at most {MAX_GPUS_PER_NODE}"
        )
    return gpus


_VENDOR_WORDS = {"NVIDIA", "TESLA", "GEFORCE", "QUADRO"}


def normalize_model(driver_name: str, memory_total_mb: int | None) -> str:
    """Short model name from the driver's name and memory: "NVIDIA A100-SXM4-80GB" with
    81920 MB -> "A100-80GB"; "NVIDIA GeForce RTX 4090" -> "RTX4090-24GB".

    For a known family the nearest known size is used, since drivers report a little less
    than the nominal memory (a 16 GB T4 shows 15360 MB). Where the memory cannot be read
    (None: a GPU in MIG mode may not tell its whole memory) the size in the name is used
    ("... 80GB HBM3"), else the family's first known size."""
    if memory_total_mb is None:
        named = re.search(r"(\d+)\s*GB", driver_name.upper())
        memory_total_mb = int(named.group(1)) * MB_PER_GB if named else None
    words = [w for w in re.split(r"[\s\-_]+", driver_name.upper()) if w]
    words = [w for w in words if w not in _VENDOR_WORDS] or ["GPU"]
    family = words[0]
    if family == "RTX" and len(words) > 1:
        family = words[1] if words[1].startswith("A") else "RTX" + words[1]
    profile = KNOWN_MODELS.get(family)
    if memory_total_mb is None:
        memory_total_mb = (profile.memory_gb[0] if profile else _GENERIC.memory_gb[0]) * MB_PER_GB
    gb_exact = memory_total_mb / MB_PER_GB
    if profile is not None:
        gb = min(profile.memory_gb, key=lambda size: abs(size - gb_exact))
        if abs(gb - gb_exact) > 0.15 * gb:
            gb = round(gb_exact)
    else:
        gb = round(gb_exact)
    return f"{family}-{gb}GB"
