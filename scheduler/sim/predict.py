"""Runtime prediction in the simulator: the production predictor, fed as production feeds it.

The predictor sees a job when it arrives (`predict`) and learns its true runtime when it
finishes (`observe`); what it said at arrival is kept on the job for the prediction-error
metric and passed to policies as `PendingJob.predicted_runtime`. Traces without user or
job names (Philly) give it only the team to learn from.
"""

from __future__ import annotations

from typing import Any

from scheduler.sim.jobs import JobSpec


def make_predictor(**params: Any) -> SimPredictor:
    from scheduler.core.prediction import RuntimePredictor

    return SimPredictor(RuntimePredictor(**params))


class SimPredictor:
    def __init__(self, predictor: Any) -> None:
        self.predictor = predictor

    def predict(self, spec: JobSpec) -> float | None:
        if not spec.time_limit:
            return None
        return self.predictor.predict(spec.user, spec.name, spec.time_limit)

    def observe(self, spec: JobSpec, runtime: float) -> None:
        if spec.time_limit:
            self.predictor.update(spec.user, spec.name, spec.time_limit, runtime)
