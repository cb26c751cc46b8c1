"""Jobs as the simulator replays them, and the time limits simulated users ask for.

A `JobSpec` is what a trace or generator says about a job: when it arrives, how many seconds
of work it needs when running alone (`duration`, its isolated runtime), and its request. The
user's `time_limit` is what the scheduler sees; the true duration is known only to the
simulator (and to the srpt-oracle).

A job asks `gpus` in total. With `gpus_per_node` it is a multi-node gang of
`gpus // gpus_per_node` members, one per node (as `scheduler.core.model.PendingJob`); `cpus`
and `memory_mb` are asked per member (per node).

GPU models differ in speed, and by how much depends on the job (Gavel, OSDI'20): `speeds`
gives the job's relative speed per GPU model, `(("V100", 1.0), ("K80", 0.3))`; its
`duration` is then seconds at speed 1.0, and on a model of speed s it runs `duration / s`.
A model the job does not name, and every model of a job without speeds, runs at 1.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from scheduler.core.model import nodes_spanned

# Values people type into a time-limit field, in seconds: 5, 10, 15, 30 minutes, 1, 2, 3, 4,
# 6, 8, 12 hours, 1, 2, 3 days, 1, 2 weeks, 30 days. Above that, whole days.
COMMON_LIMITS = tuple(
    m * 60
    for m in (5, 10, 15, 30, 60, 120, 180, 240, 360, 480, 720, 1440, 2880, 4320, 10080, 20160)
) + (30 * 86400,)

DAY = 86400.0


@dataclass(frozen=True, slots=True)
class JobSpec:
    id: int
    submit: float
    duration: float
    gpus: int
    team: str
    user: str
    name: str = ""
    time_limit: float | None = None
    gpu_model: str | None = None
    # Fractional requests (gpus == 0): memory and compute share of one GPU.
    gpu_memory_mb: int | None = None
    gpu_compute_percent: int | None = None
    priority: int = 0
    # 0: every GPU on one node; else a gang of gpus // gpus_per_node nodes.
    gpus_per_node: int = 0
    # Host CPU cores and memory (MiB) per member; 0 asks for none.
    cpus: int = 0
    memory_mb: int = 0
    # Whether a preemption keeps the job's progress (it writes to FLEET_CHECKPOINT_DIR and
    # resumes from it); None: the run's SimConfig.checkpointing decides.
    checkpointed: bool | None = None
    # Relative speed per GPU model, (model, speed) pairs; (): every model runs at 1.0.
    speeds: tuple[tuple[str, float], ...] = ()

    def speed_on(self, model: str) -> float:
        """The job's relative speed on a GPU model (1.0 where its speeds do not name it)."""
        for name, speed in self.speeds:
            if name == model:
                return speed
        return 1.0

    @property
    def nodes(self) -> int:
        """How many nodes the job spans (1 unless it is a multi-node gang)."""
        return nodes_spanned(self.gpus, self.gpus_per_node)

    @property
    def gpus_on_each_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def work(self) -> float:
        """Seconds the job runs when nothing stops it: its duration, cut by its time limit."""
        if self.time_limit is None:
            return self.duration
        return min(self.duration, self.time_limit)

    @property
    def gpu_equivalent(self) -> float:
        if self.gpus:
            return float(self.gpus)
        return (self.gpu_compute_percent or 100) / 100.0


def round_up_limit(seconds: float) -> float:
    """The smallest common time-limit value at or above `seconds` (whole days past 30 days)."""
    for value in COMMON_LIMITS:
        if seconds <= value:
            return float(value)
    return math.ceil(seconds / DAY) * DAY


def assign_time_limits(
    jobs: list[JobSpec], *, seed: int = 0, median: float = 2.0, sigma: float = 0.7
) -> list[JobSpec]:
    """Give every job without a time limit one that over-asks the way users do.

    limit = round_up(duration x f), f lognormal with the given median (2x by default) and
    log-sigma, clipped to f >= 1.0 so that no job is killed by its own limit; then rounded up
    to a common value (15 min, 1 h, 4 h, 1 day...). Deterministic for a seed and job order.
    """
    rng = np.random.default_rng(seed)
    factors = np.maximum(1.0, rng.lognormal(math.log(median), sigma, size=len(jobs)))
    out = []
    for job, f in zip(jobs, factors, strict=True):
        if job.time_limit is not None:
            out.append(job)
        else:
            out.append(replace(job, time_limit=round_up_limit(job.duration * float(f))))
    return out
