"""What a simulated run is told: cycle timing, preemption costs, settings for the policy,
team guarantees, which shortcuts it may take."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SimConfig:
    cycle_interval: float = 60.0
    cycle_backoff: float = 8.0  # idle timer cycles stretch up to this multiple of the interval
    restart_overhead: float = 60.0
    checkpointing: bool = False
    max_requeues: int | None = None  # None: no limit
    settings: Mapping[str, Any] = field(default_factory=dict)
    # Guaranteed GPUs per team (TeamState.guaranteed_gpus); policies let a team within its
    # guarantee reclaim GPUs from teams borrowing beyond theirs. Empty: no guarantees.
    team_guaranteed: Mapping[str, int] = field(default_factory=dict)
    record_timeline: bool = True
    # Skip a cycle when no pending job could fit anywhere (smallest gang > largest free
    # block), even where the policy might preempt then (not exact for those).
    skip_when_full: bool = False
    # Skip cycles that cannot decide anything, where the policy says so (see
    # scheduler.sim.engine): the run is the same as without skipping.
    skip_exact: bool = True
    # Wait sentences in plans (settings "explain"); the simulator never reads them.
    explain: bool = False
    # Waits in plans at all (settings "plan_waits"): the simulator applies only places,
    # preempts and reserves, so by default policies leave them out.
    plan_waits: bool = False
    # Slowdown per extra node and per extra topology group of a multi-node gang (0.1: a gang
    # over two groups runs its work 10% slower); 0 disables.
    gang_spread_slowdown: float = 0.1
    # Jobs' relative speeds per GPU model (JobSpec.speeds) shown to policies as declared
    # (PendingJob.gpu_speeds); off: policies only see what the snapshot's table learns.
    declare_speeds: bool = True
