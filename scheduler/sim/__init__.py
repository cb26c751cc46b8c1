"""Trace-driven simulator: replays jobs through the production policy objects.

Pure Python (no Django, no Celery). See scheduler/sim/README.md for the input formats, the
preemption model and the metrics; `python -m scheduler.sim --help` for the command line.
"""

from scheduler.sim.cluster import ClusterSpec, parse_cluster
from scheduler.sim.engine import PolicyDriver, SimResult, apply_plan, simulate
from scheduler.sim.jobs import JobSpec, assign_time_limits
from scheduler.sim.metrics import compute_metrics
from scheduler.sim.state import SimConfig, SimState

__all__ = [
    "ClusterSpec",
    "JobSpec",
    "PolicyDriver",
    "SimConfig",
    "SimResult",
    "SimState",
    "apply_plan",
    "assign_time_limits",
    "compute_metrics",
    "parse_cluster",
    "simulate",
]
