"""GPU backends of the agent: NVML on real hosts, a simulated backend when asked for.

Pure code: imports neither Django nor Celery. Typical use::

    backend = select_backend(os.environ.get("FLEET_SIMULATE_GPUS"), node_name="gpu-01")
    gpus = backend.inventory()          # once, at registration
    samples = backend.sample()          # every telemetry tick
    payload = [s.to_dict() for s in samples]
"""

from workers.gpu.models import GpuSpecError, normalize_model, parse_gpu_spec
from workers.gpu.nvml import NvmlBackend
from workers.gpu.select import select_backend
from workers.gpu.simulated import SimulatedGpuBackend
from workers.gpu.types import (
    GpuBackend,
    GpuBackendError,
    GpuFinding,
    GpuInfo,
    GpuProcess,
    GpuSample,
)

__all__ = [
    "GpuBackend",
    "GpuBackendError",
    "GpuFinding",
    "GpuInfo",
    "GpuProcess",
    "GpuSample",
    "GpuSpecError",
    "NvmlBackend",
    "SimulatedGpuBackend",
    "normalize_model",
    "parse_gpu_spec",
    "select_backend",
]
