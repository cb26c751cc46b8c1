"""What the agent is asked to run, and the environment a job process sees."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.executor.mps import Mps, mps_environment, mps_probe

DEFAULT_LOG_CAP_BYTES = 64 * 1024 * 1024
DEFAULT_GRACE_S = 30.0

JobKey = tuple[Any, int]  # (job_id, attempt)


class ExecutorError(RuntimeError):
    """A job could not be started (bad working directory, bad declared load, ...)."""


class LeaseExpired(ExecutorError):
    """The node's lease had run out when the job was to start, so it was not started: the
    control side may already run the attempt's successor elsewhere (workers.lease)."""


MAX_NODES = 4096
# A host name, an IPv4 address or an IPv6 address (brackets allowed): what torchrun and NCCL
# take as MASTER_ADDR. No spaces or commas, so FLEET_NODELIST splits back into the hosts.
_ADDRESS = re.compile(r"^[A-Za-z0-9._:%\[\]-]{1,253}$")


def _whole(raw: Mapping[str, Any], name: str, low: int, high: int, what: str) -> int:
    if name not in raw:
        raise ExecutorError(f"{what} lacks {name!r}")
    value = raw[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ExecutorError(
            f"{what} has {name}={value!r}; it must be a whole number from {low} to {high}"
        )
    return value


def check_address(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _ADDRESS.match(value):
        raise ExecutorError(
            f"{what} {value!r} is not a host name or IP address (letters, digits, '.', ':', "
            "'-', '_' only)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where the members of one job find each other (the control side's start message).

    `rank` is this member's place among `nnodes` members, `hosts` the address of each
    member's node in rank order (`hosts[0]` is `master_addr`, where rank 0 listens on
    `master_port`), `gpus_per_node` the GPUs each member has and `world_size` the GPUs of the
    whole job (1 for a fraction of a GPU). A single-node job is one member of rank 0.
    """

    rank: int
    nnodes: int
    gpus_per_node: int
    world_size: int
    master_addr: str
    master_port: int
    hosts: tuple[str, ...]

    @classmethod
    def parse(cls, raw: Any) -> Rendezvous:
        """Check every field of the start message's `rendezvous`; ExecutorError names the
        first that is wrong."""
        what = "the rendezvous"
        if not isinstance(raw, Mapping):
            raise ExecutorError(f"{what} is {type(raw).__name__}, not an object")
        nnodes = _whole(raw, "nnodes", 1, MAX_NODES, what)
        rank = _whole(raw, "rank", 0, nnodes - 1, what)
        gpus_per_node = _whole(raw, "gpus_per_node", 0, 1024, what)
        world_size = _whole(raw, "world_size", 1, MAX_NODES * 1024, what)
        if nnodes > 1 and gpus_per_node and world_size != nnodes * gpus_per_node:
            raise ExecutorError(
                f"{what} has world_size={world_size}, but {nnodes} nodes of {gpus_per_node} "
                f"GPUs make {nnodes * gpus_per_node}"
            )
        master_addr = check_address(raw.get("master_addr"), "its master_addr")
        master_port = _whole(raw, "master_port", 1, 65535, what)
        hosts = raw.get("hosts")
        if not isinstance(hosts, list | tuple) or len(hosts) != nnodes:
            raise ExecutorError(
                f"{what} has hosts={hosts!r}; it must list the {nnodes} member nodes' "
                "addresses in rank order"
            )
        hosts = tuple(check_address(h, "its host") for h in hosts)
        if hosts[0] != master_addr:
            raise ExecutorError(
                f"{what} has master_addr={master_addr!r} but rank 0's host is {hosts[0]!r}"
            )
        return cls(rank, nnodes, gpus_per_node, world_size, master_addr, master_port, hosts)


MAX_ARRAY_TASKS = 1 << 24


@dataclass(frozen=True, slots=True)
class ArrayTask:
    """The job as one task of a job array: the array's id, this task's index and how many
    tasks the array has (FLEET_ARRAY_JOB_ID, FLEET_ARRAY_INDEX, FLEET_ARRAY_TASK_COUNT)."""

    job_id: int
    index: int
    count: int

    @classmethod
    def parse(cls, raw: Any) -> ArrayTask:
        """Check every field of the start message's `array`; ExecutorError names the first
        that is wrong."""
        what = "the array"
        if not isinstance(raw, Mapping):
            raise ExecutorError(f"{what} is {type(raw).__name__}, not an object")
        job_id = _whole(raw, "job_id", 1, (1 << 63) - 1, what)
        count = _whole(raw, "count", 1, MAX_ARRAY_TASKS, what)
        index = _whole(raw, "index", 0, (1 << 31) - 1, what)
        return cls(job_id, index, count)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One attempt of one job.

    `command` is a shell string run with `/bin/sh -c`. `gpu_indices` are NVML indices on
    this host. A fractional job has one index and `gpu_memory_mb` / `gpu_compute_percent`;
    its measured GPU memory is enforced (see `Supervisor`). `cpus` and `memory_mb` are the
    host CPUs and memory the job asked for (0: not asked), enforced where the agent confines
    jobs (workers.executor.cgroups). `rendezvous` says how this member meets the job's other
    members (None: a start from a control side that sends none). `time_limit` is in seconds
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
    cpus: int = 0
    memory_mb: int = 0
    rendezvous: Rendezvous | None = None
    array: ArrayTask | None = None

    @property
    def key(self) -> JobKey:
        return (self.job_id, self.attempt)

    @property
    def is_fractional(self) -> bool:
        return self.gpu_memory_mb is not None or self.gpu_compute_percent is not None

    @property
    def rank(self) -> int:
        return self.rendezvous.rank if self.rendezvous else 0

    @property
    def local_world_size(self) -> int:
        """GPUs of this member: the assigned GPUs, 1 for a fraction of one."""
        if self.is_fractional:
            return 1
        if self.gpu_indices:
            return len(self.gpu_indices)
        return max(1, self.rendezvous.gpus_per_node if self.rendezvous else 1)

    @classmethod
    def from_record(cls, raw: dict[str, Any]) -> JobSpec:
        """The spec as `dataclasses.asdict` saved it (an attempt record)."""
        raw = dict(raw)
        raw["gpu_indices"] = tuple(raw.get("gpu_indices") or ())
        rendezvous = raw.get("rendezvous")
        if rendezvous is not None:
            raw["rendezvous"] = Rendezvous(**{**rendezvous, "hosts": tuple(rendezvous["hosts"])})
        if raw.get("array") is not None:
            raw["array"] = ArrayTask(**raw["array"])
        return cls(**raw)


def _optional_number(spec: Mapping[str, Any], name: str, kind: type) -> Any:
    value = spec.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ExecutorError(f"{name}={value!r} is not a number of 0 or more")
    return kind(value)


def spec_from_start(
    job_id: Any, attempt: int, spec: Mapping[str, Any], *, log_path: str, default_grace: float
) -> JobSpec:
    """The JobSpec of a start message's `spec`, every field checked first: ExecutorError
    names what is wrong, and nothing is started on a spec that fails (never half-applied)."""
    if not isinstance(spec.get("command"), str) or not spec["command"]:
        raise ExecutorError("the start has no command")
    env = spec.get("env") or {}
    if not isinstance(env, Mapping):
        raise ExecutorError(f"env is {type(env).__name__}, not an object")
    indices = spec.get("gpu_indices") or ()
    if not isinstance(indices, list | tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices
    ):
        raise ExecutorError(f"gpu_indices={indices!r} is not a list of GPU indices")
    what = "the start"
    cpus = _whole(spec, "cpus", 0, 1 << 20, what) if "cpus" in spec else 0
    memory_mb = _whole(spec, "memory_mb", 0, 1 << 40, what) if "memory_mb" in spec else 0
    raw_rendezvous = spec.get("rendezvous")
    rendezvous = None if raw_rendezvous is None else Rendezvous.parse(raw_rendezvous)
    raw_array = spec.get("array")
    array = None if raw_array is None else ArrayTask.parse(raw_array)
    job = JobSpec(
        job_id=job_id,
        attempt=int(attempt),
        command=spec["command"],
        log_path=log_path,
        env={str(k): str(v) for k, v in env.items()},
        workdir=spec.get("workdir") or None,
        gpu_indices=tuple(indices),
        time_limit=_optional_number(spec, "time_limit", float) or None,
        gpu_memory_mb=_optional_number(spec, "gpu_memory_mb", int),
        gpu_compute_percent=_optional_number(spec, "gpu_compute_percent", int),
        grace=_optional_number(spec, "grace", float) or default_grace,
        user=spec.get("user") or None,
        team=spec.get("team") or None,
        cpus=cpus,
        memory_mb=memory_mb,
        rendezvous=rendezvous,
        array=array,
    )
    if (
        rendezvous is not None
        and rendezvous.gpus_per_node
        and job.gpu_indices
        and not job.is_fractional
        and len(job.gpu_indices) != rendezvous.gpus_per_node
    ):
        raise ExecutorError(
            f"the rendezvous gives each node {rendezvous.gpus_per_node} GPUs, but this "
            f"member is assigned {len(job.gpu_indices)}"
        )
    return job


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
# Fleet's own names for the rendezvous: a job's own values for them are always dropped.
# MASTER_ADDR and the other torch names are fleet's only when the start has a rendezvous.
RENDEZVOUS_VARIABLES = ("FLEET_NNODES", "FLEET_NODE_RANK", "FLEET_NODELIST")
ARRAY_VARIABLES = ("FLEET_ARRAY_JOB_ID", "FLEET_ARRAY_INDEX", "FLEET_ARRAY_TASK_COUNT")


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
    mps: Mps | None = None,
    checkpoint_dir: str | None = None,
    stop_signal: str | None = None,
    mig_devices: Mapping[int, str] | None = None,
) -> dict[str, str]:
    """What the job's process sees, in layers, each overriding the one before:

    1. the allow-listed part of the agent's environment (see `inherited_environment`);
    2. `account`: HOME, USER, LOGNAME and SHELL of the account the job runs as;
    3. the job's own variables;
    4. what fleet sets, so a job cannot pose as another job or widen its GPUs.

    A job with a rendezvous gets what torchrun and torch.distributed read: MASTER_ADDR,
    MASTER_PORT, WORLD_SIZE (GPUs of the whole job), NODE_RANK, LOCAL_WORLD_SIZE (GPUs of
    this member), and FLEET_NNODES, FLEET_NODE_RANK, FLEET_NODELIST (the members' hosts in
    rank order, comma-separated). FLEET_CPUS and FLEET_MEMORY_MB say what the job asked
    for, when it did. A task of a job array gets FLEET_ARRAY_JOB_ID, FLEET_ARRAY_INDEX and
    FLEET_ARRAY_TASK_COUNT (like Slurm's SLURM_ARRAY_*). FLEET_CHECKPOINT_DIR is the job's
    directory kept across its attempts, and FLEET_CHECKPOINT_SIGNAL the signal it gets first
    when it is stopped (the executor passes both; workers.executor.checkpoints).

    CUDA_VISIBLE_DEVICES lists the assigned NVML indices, and CUDA_DEVICE_ORDER=PCI_BUS_ID
    makes CUDA number GPUs the way NVML and nvidia-smi do (CUDA's default order is
    fastest-first, which can differ). Indices rather than UUIDs keep the variable readable
    and work the same on simulated nodes. A job with no GPUs gets an empty list, so it sees
    none. An index that is a MIG device (`mig_devices`: index -> "MIG-..." UUID, from the
    GPU backend; docs/mig.md) is listed by its UUID, the only way CUDA names a MIG device.

    A fraction of one GPU on a host running CUDA MPS (`mps`, default: probed in `base_env`)
    also gets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT from its
    share, and the daemon's pipe and log directories (see workers.executor.mps); not on a
    MIG device, whose share is the slice itself.
    """
    mig = mig_devices or {}
    env = inherited_environment(base_env, allow)
    env.update(account or {})
    env.update({str(k): str(v) for k, v in spec.env.items()})
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(mig.get(i, str(i)) for i in spec.gpu_indices),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "FLEET_JOB_ID": str(spec.job_id),
            "FLEET_ATTEMPT": str(spec.attempt),
            "FLEET_PREEMPT_GRACE": f"{spec.grace:g}",
        }
    )
    for name in ("FLEET_GPU_MEMORY_MB", "FLEET_GPU_COMPUTE_PERCENT", "FLEET_CPUS",
                 "FLEET_CHECKPOINT_DIR", "FLEET_CHECKPOINT_SIGNAL",
                 "FLEET_MEMORY_MB", *RENDEZVOUS_VARIABLES, *ARRAY_VARIABLES):  # fmt: skip
        env.pop(name, None)
    rdv = spec.rendezvous
    if rdv is not None:
        env.update(
            {
                "MASTER_ADDR": rdv.master_addr,
                "MASTER_PORT": str(rdv.master_port),
                "WORLD_SIZE": str(rdv.world_size),
                "NODE_RANK": str(rdv.rank),
                "LOCAL_WORLD_SIZE": str(spec.local_world_size),
                "FLEET_NNODES": str(rdv.nnodes),
                "FLEET_NODE_RANK": str(rdv.rank),
                "FLEET_NODELIST": ",".join(rdv.hosts),
            }
        )
    if spec.array is not None:
        env["FLEET_ARRAY_JOB_ID"] = str(spec.array.job_id)
        env["FLEET_ARRAY_INDEX"] = str(spec.array.index)
        env["FLEET_ARRAY_TASK_COUNT"] = str(spec.array.count)
    if checkpoint_dir:
        env["FLEET_CHECKPOINT_DIR"] = checkpoint_dir
    if stop_signal:
        env["FLEET_CHECKPOINT_SIGNAL"] = stop_signal
    if spec.cpus:
        env["FLEET_CPUS"] = str(spec.cpus)
    if spec.memory_mb:
        env["FLEET_MEMORY_MB"] = str(spec.memory_mb)
    if spec.gpu_memory_mb is not None:
        env["FLEET_GPU_MEMORY_MB"] = str(spec.gpu_memory_mb)
    if spec.gpu_compute_percent is not None:
        env["FLEET_GPU_COMPUTE_PERCENT"] = str(spec.gpu_compute_percent)
    on_mig = any(i in mig for i in spec.gpu_indices)
    if not on_mig:
        env.update(mps_environment(spec, mps if mps is not None else mps_probe(base_env)))
    return env
