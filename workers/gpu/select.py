"""Choosing the GPU backend for an agent."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from workers.gpu.types import GpuBackend


def select_backend(
    simulate_spec: str | None,
    node_name: str,
    *,
    seed: int | None = None,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
) -> GpuBackend:
    """NVML unless simulation is asked for, by `simulate_spec` or by the environment
    variable `FLEET_SIMULATE_GPUS` (the argument wins). `seed` defaults to `FLEET_SIM_SEED`
    or 0. With NVML, failure to load it raises `GpuBackendError`: a host that was meant to
    have GPUs never silently reports simulated ones. `FLEET_MIG` (`on`, the default, or
    `off`) says whether the MIG devices of GPUs in MIG mode are offered (docs/mig.md)."""
    env = os.environ if environ is None else environ
    spec = simulate_spec or env.get("FLEET_SIMULATE_GPUS") or None
    if spec:
        from workers.gpu.simulated import SimulatedGpuBackend

        if seed is None:
            raw = env.get("FLEET_SIM_SEED", "0") or "0"
            try:
                seed = int(raw)
            except ValueError:
                raise ValueError(f"FLEET_SIM_SEED={raw!r} is not an integer") from None
        return SimulatedGpuBackend(
            spec,
            node_name=node_name,
            seed=seed,
            clock=clock,
            faults=env.get("FLEET_SIM_GPU_FAULTS", ""),
            faults_file=env.get("FLEET_SIM_GPU_FAULTS_FILE") or None,
        )
    from workers.gpu.nvml import NvmlBackend

    return NvmlBackend(clock=clock, use_mig=mig_setting(env))


def mig_setting(env: Mapping[str, str]) -> bool:
    """FLEET_MIG: `on` (default) offers each MIG device of a GPU in MIG mode as a GPU;
    `off` offers GPUs in MIG mode not at all (their slices are left to other uses)."""
    raw = env.get("FLEET_MIG", "").strip().lower()
    if raw in ("", "on"):
        return True
    if raw == "off":
        return False
    raise ValueError(f"FLEET_MIG={raw!r} must be 'on' (offer MIG devices as GPUs) or 'off'")
