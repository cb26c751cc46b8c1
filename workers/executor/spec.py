"""What the agent is asked to run, and the environment a job process sees."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_LOG_CAP_BYTES = 64 * 1024 * 1024
DEFAULT_GRACE_S = 30.0

JobKey = tuple[Any, int]  # (job_id, attempt)


class ExecutorError(RuntimeError):
    """A job could not be started (bad working directory, bad declared load, ...)."""


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One attempt of one job.

    `command` is a shell string run with `/bin/sh -c`. `gpu_indices` are NVML indices on
    this host. A fractional job has one index and `gpu_memory_mb` / `gpu_compute_percent`;
    its measured GPU memory is enforced (see `Supervisor`). `time_limit` is in seconds
    (None: no limit). `grace` is the time between SIGTERM and SIGKILL when the job is
    stopped for any reason; the job sees it as FLEET_PREEMPT_GRACE. `log_path` receives
    stdout and stderr, capped at `log_cap_bytes`. `user` and `team` (the owner's username
    and the team's slug) choose the local account the job runs as (see `JobAccounts`).
    """

    job_id: Any
    attempt: int
    command: str
    log_path: str
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    gpu_indices: tuple[int, ...] = ()
    time_limit: float | None = None
    gpu_memory_mb: int | None = None
    gpu_compute_percent: int | None = None
    grace: float = DEFAULT_GRACE_S
    log_cap_bytes: int = DEFAULT_LOG_CAP_BYTES
    user: str | None = None
    team: str | None = None

    @property
    def key(self) -> JobKey:
        return (self.job_id, self.attempt)

    @property
    def is_fractional(self) -> bool:
        return self.gpu_memory_mb is not None or self.gpu_compute_percent is not None


# What a job may inherit from the agent's environment: where programs and libraries are,
# language and time zone, and what the GPU driver and CUDA need. Everything else the agent
# holds (the broker URL, its node key, FLEET_* settings) stays with the agent. A name ending
# in "*" allows every name with that prefix.
JOB_ENV_ALLOW: tuple[str, ...] = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_VISIBLE_DEVICES",
)
# Never passed from the agent to a job, whatever an admin adds to the allow-list.
NEVER_INHERITED = frozenset(
    {"REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL", "SECRET_KEY"}
)
ACCOUNT_VARIABLES = ("HOME", "USER", "LOGNAME", "SHELL")


def _allowed(name: str, allow: Sequence[str]) -> bool:
    if name in NEVER_INHERITED or name.startswith("FLEET_"):
        return False
    return any(name.startswith(a[:-1]) if a.endswith("*") else name == a for a in allow)


def inherited_environment(
    base_env: Mapping[str, str] | None = None, allow: Sequence[str] = ()
) -> dict[str, str]:
    """The part of the agent's environment (default: os.environ) a job inherits: the names
    in JOB_ENV_ALLOW and `allow` (FLEET_JOB_ENV_ALLOW), never fleet's own secrets or
    settings (NEVER_INHERITED, FLEET_*)."""
    names = (*JOB_ENV_ALLOW, *allow)
    source = os.environ if base_env is None else base_env
    return {k: v for k, v in source.items() if _allowed(k, names)}


def job_environment(
    spec: JobSpec,
    base_env: Mapping[str, str] | None = None,
    *,
    allow: Sequence[str] = (),
    account: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """What the job's process sees, in layers, each overriding the one before:

    1. the allow-listed part of the agent's environment (see `inherited_environment`);
    2. `account`: HOME, USER, LOGNAME and SHELL of the account the job runs as;
    3. the job's own variables;
    4. what fleet sets, so a job cannot pose as another job or widen its GPUs.

    CUDA_VISIBLE_DEVICES lists the assigned NVML indices, and CUDA_DEVICE_ORDER=PCI_BUS_ID
    makes CUDA number GPUs the way NVML and nvidia-smi do (CUDA's default order is
    fastest-first, which can differ). Indices rather than UUIDs keep the variable readable
    and work the same on simulated nodes. A job with no GPUs gets an empty list, so it sees
    none.
    """
    env = inherited_environment(base_env, allow)
    env.update(account or {})
    env.update({str(k): str(v) for k, v in spec.env.items()})
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in spec.gpu_indices),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "FLEET_JOB_ID": str(spec.job_id),
            "FLEET_ATTEMPT": str(spec.attempt),
            "FLEET_PREEMPT_GRACE": f"{spec.grace:g}",
        }
    )
    for name in ("FLEET_GPU_MEMORY_MB", "FLEET_GPU_COMPUTE_PERCENT"):
        env.pop(name, None)
    if spec.gpu_memory_mb is not None:
        env["FLEET_GPU_MEMORY_MB"] = str(spec.gpu_memory_mb)
    if spec.gpu_compute_percent is not None:
        env["FLEET_GPU_COMPUTE_PERCENT"] = str(spec.gpu_compute_percent)
    return env
