"""Running named policies over one job list: the production registry plus the simulator's own
reference drivers, each on a fresh state, with the same jobs, cluster and settings."""

from __future__ import annotations

import inspect
import sys
from importlib import import_module
from typing import Any

from scheduler.sim.cluster import ClusterSpec
from scheduler.sim.engine import PolicyDriver, SimResult, simulate
from scheduler.sim.jobs import JobSpec
from scheduler.sim.metrics import compute_metrics, ratios
from scheduler.sim.predict import make_predictor
from scheduler.sim.state import SimConfig

# Drivers that live in the simulator, not in the production registry: they act on the
# simulated state directly (the oracle sees true runtimes; no production cycle can).
SIM_DRIVERS: dict[str, str] = {
    "srpt-oracle": "scheduler.sim.oracle:SrptOracle",
    "rl-cem": "scheduler.rl.baseline:CemDriver",
}
ORACLE = "srpt-oracle"
BASELINE = "fcfs"


def production_names() -> list[str]:
    from scheduler.policies import policy_names

    return policy_names()


def all_names() -> list[str]:
    return [*production_names(), *SIM_DRIVERS]


def make_driver(name: str, *, seed: int = 0, params: dict[str, Any] | None = None) -> Any:
    params = dict(params or {})
    if name in SIM_DRIVERS:
        module, _, cls = SIM_DRIVERS[name].partition(":")
        return getattr(import_module(module), cls)(**params)
    from scheduler.policies import get_policy, policy_class

    accepted = inspect.signature(policy_class(name)).parameters
    if "seed" in accepted or any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        params.setdefault("seed", seed)
    return PolicyDriver(get_policy(name, **params))


def run_one(
    name: str,
    jobs: list[JobSpec],
    cluster: ClusterSpec,
    config: SimConfig,
    *,
    seed: int = 0,
    predict: bool = True,
    progress: bool = False,
    params: dict[str, Any] | None = None,
) -> tuple[SimResult, dict[str, Any]]:
    driver = make_driver(name, seed=seed, params=params)
    predictor = make_predictor() if predict and name != ORACLE else None
    result = simulate(jobs, cluster, driver, config, predictor=predictor, progress=progress)
    return result, compute_metrics(result)


def run_many(
    names: list[str],
    jobs: list[JobSpec],
    cluster: ClusterSpec,
    config: SimConfig,
    *,
    seed: int = 0,
    predict: bool = True,
    progress: bool = False,
    keep_results: bool = False,
) -> tuple[dict[str, dict[str, Any]], dict[str, SimResult]]:
    """Metrics per policy, with `vs_oracle` and `vs_fcfs` ratios where those ran too.
    A policy that raises is reported with its error instead of stopping the others."""
    metrics: dict[str, dict[str, Any]] = {}
    results: dict[str, SimResult] = {}
    for name in names:
        if progress:
            print(f"running {name} on {len(jobs)} jobs...", file=sys.stderr, flush=True)
        try:
            result, m = run_one(
                name, jobs, cluster, config, seed=seed, predict=predict, progress=progress
            )
        except Exception as exc:  # noqa: BLE001 - one broken policy must not hide the rest
            metrics[name] = {"policy": name, "error": f"{type(exc).__name__}: {exc}"}
            continue
        metrics[name] = m
        if keep_results:
            results[name] = result
    for ref_name, key in ((ORACLE, "vs_oracle"), (BASELINE, "vs_fcfs")):
        ref = metrics.get(ref_name)
        if ref and "error" not in ref:
            for m in metrics.values():
                if "error" not in m:
                    m[key] = ratios(m, ref)
    return metrics, results
