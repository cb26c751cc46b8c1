"""Pure scheduling core: snapshot and plan types shared by the production cycle,
the trace simulator, tests and benchmarks. No Django, no Celery, no clock reads."""

from scheduler.core.model import (
    GpuState,
    NodeState,
    PendingJob,
    Place,
    Plan,
    Preempt,
    Reserve,
    RunningJob,
    Snapshot,
    TeamState,
    Wait,
)

__all__ = [
    "GpuState",
    "NodeState",
    "PendingJob",
    "Place",
    "Plan",
    "Preempt",
    "Reserve",
    "RunningJob",
    "Snapshot",
    "TeamState",
    "Wait",
]
