"""Check a GPU host before it joins the fleet: the agent's runtime, without a broker or keys,
reads the GPUs, runs one job on GPU 0 as a real subprocess, and prints what it would send.

    python scripts/gpu_check.py                          # NVML (the host's real GPUs)
    python scripts/gpu_check.py --simulate 1xH100-80GB   # the simulated backend
    python scripts/gpu_check.py --command "python3 my_probe.py"

It prints the inventory the agent would register, each telemetry sample taken while the job
runs (utilization, memory, power, temperature, clocks, throttle reasons, and the job each
GPU process belongs to), the job's report and the end of its log. The default job uses
PyTorch or CuPy where either is installed (a few seconds of matrix products), else
`nvidia-smi`. Exit status 0 when the job succeeded and, under NVML, some sample showed its
process on the GPU; 1 otherwise; 2 when the GPUs cannot be read at all (no NVML, a bad
`--simulate` spec), with the reason. Jobs run as this account; nothing is sent anywhere.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.executor.accounts import JobAccounts  # noqa: E402
from workers.gpu import GpuBackendError, GpuSpecError, select_backend  # noqa: E402
from workers.runtime import (  # noqa: E402
    LOG_TASK,
    REGISTER_TASK,
    REPORT_TASK,
    TELEMETRY_TASK,
    Agent,
    AgentConfig,
)

# A few seconds of work on the GPU that the job is given (CUDA_VISIBLE_DEVICES is set by the
# executor to the GPU it was placed on).
DEFAULT_JOB = r"""
import shutil, subprocess, sys, time
try:
    import torch
    x = torch.randn(8192, 8192, device="cuda")
    end = time.time() + 6
    n = 0
    while time.time() < end:
        y = x @ x
        n += 1
    torch.cuda.synchronize()
    print(f"torch {torch.__version__}: {n} matmuls of 8192x8192 on {torch.cuda.get_device_name(0)}")
    sys.exit(0)
except ImportError:
    pass
try:
    import cupy
    x = cupy.random.standard_normal((8192, 8192), dtype=cupy.float32)
    end = time.time() + 6
    while time.time() < end:
        y = x @ x
    cupy.cuda.Device().synchronize()
    print("cupy: matmuls done")
    sys.exit(0)
except ImportError:
    pass
if shutil.which("nvidia-smi"):
    sys.exit(subprocess.call(["nvidia-smi"]))
print("no PyTorch, CuPy or nvidia-smi to exercise the GPU")
sys.exit(1)
"""


class Recorder:
    """The agent's `send`: keeps every message instead of publishing it."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, task: str, **kwargs: Any) -> None:
        self.messages.append((task, kwargs))

    def of(self, task: str) -> list[dict[str, Any]]:
        return [kw for name, kw in self.messages if name == task]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--simulate", help="simulated GPUs, for example 1xH100-80GB (default: NVML)")
    p.add_argument("--command", help="the job's command (default: a few seconds of matmuls)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after this long")
    a = p.parse_args(argv)

    try:
        backend = select_backend(a.simulate, node_name="gpu-check")
    except (GpuBackendError, GpuSpecError, ValueError) as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    sent = Recorder()
    state = Path(tempfile.mkdtemp(prefix="fleet-gpu-check-"))
    config = AgentConfig(
        node="gpu-check", state_dir=state / "state", job_accounts=JobAccounts.own()
    )
    agent = Agent(config, backend=backend, send=sent)
    agent.register()
    registered = sent.of(REGISTER_TASK)[-1]
    print(f"backend: {backend.backend_name}")
    print("inventory:", json.dumps(registered.get("gpus"), indent=1, default=str))

    command = a.command or f"{sys.executable} -c {json.dumps(DEFAULT_JOB)}"
    pid = agent.start_job(1, 1, {"command": command, "gpu_indices": [0], "name": "gpu-check"})
    print(f"job 1.1 started, pid {pid}")
    deadline = time.monotonic() + a.timeout
    seen_on_gpu = False
    while time.monotonic() < deadline:
        agent.supervisor.poll()
        agent.telemetry_tick()
        payload = sent.of(TELEMETRY_TASK)[-1]["payload"]
        for sample in payload["gpus"]:
            jobs = [pr for pr in sample.get("processes", []) if pr.get("job_id") is not None]
            seen_on_gpu = seen_on_gpu or bool(jobs)
            print("sample:", json.dumps(sample, default=str))
        if any(r["job_id"] == 1 and r["state"] != "running" for r in sent.of(REPORT_TASK)):
            break
        time.sleep(a.interval)
    agent.logs.ship()
    reports = [
        (r["job_id"], r["attempt"], r["state"], r.get("exit_code")) for r in sent.of(REPORT_TASK)
    ]
    print("reports:", reports)
    log = b"".join(base64.b64decode(m["data"]) for m in sent.of(LOG_TASK))
    print("job log (end):", log[-2000:].decode(errors="replace") if log else "(none shipped)")
    succeeded = any(r[2] == "succeeded" for r in reports)
    real = backend.backend_name == "nvml"
    print(f"job succeeded: {succeeded}; job's process seen on the GPU by telemetry: {seen_on_gpu}")
    return 0 if succeeded and (seen_on_gpu or not real) else 1


if __name__ == "__main__":
    sys.exit(main())
