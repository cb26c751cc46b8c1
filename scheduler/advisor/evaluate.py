"""One simulator run per candidate over the fleet trace (pure: no Django, no Celery).

The jobs go through the same reader as `python -m scheduler.sim --format fleet`
(scheduler.sim.sources.fleet_jobs), without the CLI's shaping: fleet jobs carry their time
limits and host requests, and a job the current nodes can no longer hold is refused at
arrival, as production would refuse it. Jobs that are not preemptible are marked so in every
snapshot the policy sees, which the command line cannot do.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from scheduler.advisor.grid import Candidate
from scheduler.advisor.records import from_sim
from scheduler.core.model import Plan, Snapshot
from scheduler.sim.cluster import ClusterSpec
from scheduler.sim.engine import PolicyDriver, simulate
from scheduler.sim.metrics import compute_metrics
from scheduler.sim.predict import make_predictor
from scheduler.sim.runner import make_driver
from scheduler.sim.sources import fleet_jobs
from scheduler.sim.state import SimConfig


class FixedJobs:
    """A policy whose snapshots say which jobs may not be preempted."""

    def __init__(self, policy: Any, fixed: frozenset[int]) -> None:
        self.policy = policy
        self.fixed = fixed
        self.name = getattr(policy, "name", type(policy).__name__)

    def __getattr__(self, attr: str) -> Any:
        # may_preempt, time_dependent...: as the wrapped policy answers.
        return getattr(self.policy, attr)

    def schedule(self, snapshot: Snapshot) -> Plan:
        if self.fixed:
            snapshot = dataclasses.replace(
                snapshot,
                running=tuple(
                    dataclasses.replace(r, preemptible=False) if r.id in self.fixed else r
                    for r in snapshot.running
                ),
                pending=tuple(
                    dataclasses.replace(p, preemptible=False) if p.id in self.fixed else p
                    for p in snapshot.pending
                ),
            )
        return self.policy.schedule(snapshot)


def evaluate(
    rows: list[dict[str, Any]],
    cluster: ClusterSpec,
    candidates: list[Candidate],
    *,
    settings: Mapping[str, Any],
    guarantees: Mapping[str, int],
    cycle_interval: float = 60.0,
    progress: Callable[[int], None] | None = None,
    budget: float | None = None,
) -> list[dict[str, Any]]:
    """Each candidate's metrics (records.Comparison) with its policy, params and label; a
    candidate that raises is reported with its error instead of stopping the others. Once
    `budget` seconds have passed, the candidates left are reported as not simulated."""
    jobs, fixed = fleet_jobs(rows)
    out: list[dict[str, Any]] = []
    began = time.monotonic()
    for i, cand in enumerate(candidates):
        entry: dict[str, Any] = {"index": i, **cand.as_dict()}
        if budget is not None and time.monotonic() - began >= budget:
            entry["error"] = (
                f"Not simulated: the run used its {budget / 60:.0f} minutes first. Ask for "
                "fewer days to compare every candidate."
            )
            out.append(entry)
            if progress is not None:
                progress(i + 1)
            continue
        t0 = time.monotonic()
        config = SimConfig(
            cycle_interval=cycle_interval,
            settings={**settings, **cand.params},
            team_guaranteed=dict(guarantees),
            record_timeline=False,
        )
        try:
            base = make_driver(cand.policy, seed=int(settings.get("seed") or 0))
            driver = PolicyDriver(FixedJobs(base.policy, fixed))
            result = simulate(jobs, cluster, driver, config, predictor=make_predictor())
            metrics = compute_metrics(result)
        except Exception as exc:  # noqa: BLE001 - one broken policy must not hide the rest
            entry["error"] = f"{type(exc).__name__}: {exc}"
        else:
            entry["metrics"] = from_sim(metrics).as_dict()
            entry["finished"] = metrics["finished"]
            entry["not_finished"] = metrics["jobs"] - metrics["finished"]
        entry["seconds"] = round(time.monotonic() - t0, 3)
        out.append(entry)
        if progress is not None:
            progress(i + 1)
    return out
