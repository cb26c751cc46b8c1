"""ETA quality on the Philly recipe: how far the forecast a waiting job is shown at submit is
from when it really starts, and how often the 80% band holds the start.

The recipe is bench_policy_quality's (same windows, clusters, loads, time limits from the
seeded over-asking model, 60 s cycles, checkpointed 60 s restarts); the runtime predictor is
the production one, learning online. Each job is forecast once, in the first cycle it waits
(see scheduler/sim/eta_check.py); the band is calibrated online from the jobs that started
before it. Targets (issue 12): median absolute error <= 25% of the actual wait; the band
covers 75-85% of starts.

    .venv/bin/python bench/bench_eta.py --quick
    .venv/bin/python bench/bench_eta.py --policies priority,gittins --scenarios 8x8@0.7,16x4@0.7
Prints figures; not a test.
"""

from __future__ import annotations

import argparse
import sys
import time
from itertools import product
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_policy_quality import SCENARIOS, TRACE, window_jobs  # noqa: E402

from scheduler.core.eta_arrivals import DEFAULT_WINDOW  # noqa: E402
from scheduler.policies import get_policy  # noqa: E402
from scheduler.sim.cluster import parse_cluster  # noqa: E402
from scheduler.sim.engine import simulate  # noqa: E402
from scheduler.sim.eta_check import EtaDriver, eta_metrics  # noqa: E402
from scheduler.sim.predict import make_predictor  # noqa: E402
from scheduler.sim.sources import load_philly  # noqa: E402
from scheduler.sim.state import SimConfig  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--policies", default="priority,backfill,gittins")
    p.add_argument("--scenarios", default="8x8@0.7,16x4@0.7")
    p.add_argument("--starts", default="0,20000,40000")
    p.add_argument("--size", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--arrivals-window",
        default="0",
        help="seconds of recent submissions the forecast replays (0: the queue alone; "
        f"{DEFAULT_WINDOW:.0f} is the default window of scheduler.core.eta_arrivals); "
        "a comma list runs each",
    )
    p.add_argument(
        "--censored",
        default="1",
        help="1: the band counts jobs still waiting on their forecasts (production); 0: "
        "starts alone; a comma list runs each",
    )
    p.add_argument(
        "--shown-every",
        type=int,
        default=0,
        help="also score the forecast and band every waiting job shows, every this many "
        "cycles (what an owner sees at any time); 0: first forecasts only",
    )
    p.add_argument(
        "--runtimes",
        default="policy",
        help="how the forecast plays runtimes (scheduler.core.eta_runtimes): policy (the "
        "policy's, as production), predicted, median, spread, spreadK (K draws, each "
        "job's median start), or exact (every job's true runtime: the error runtime "
        "predictions alone cannot go below); a comma list runs each",
    )
    p.add_argument("--quick", action="store_true", help="one window of 500 jobs, 8x8")
    a = p.parse_args()
    if a.quick:
        a.starts, a.size, a.scenarios = "0", 500, "8x8@0.7"
    windows = [float(w) for w in a.arrivals_window.split(",")]
    censored = [c.strip() not in ("0", "false", "no") for c in a.censored.split(",")]
    runtimes = a.runtimes.split(",")
    raw = load_philly(a.trace)
    header = (
        f"{'scenario':10} {'window':>6} {'policy':13} {'runtimes':9} {'arrivals':>8} {'cens':>4} {'jobs':>5} {'waited':>6} "
        f"{'med err':>8} {'p90 err':>8} {'med err s':>9} {'cov wait':>8} {'cov all':>7} {'no eta':>6} "
        f"{'avg JCT s':>9} {'fcst s':>6}"
        + (f" {'shown':>7} {'sh err':>7} {'sh cov':>6}" if a.shown_every else "")
    )
    print(header)
    for scen in a.scenarios.split(","):
        spec, load = SCENARIOS[scen]
        cluster = parse_cluster(spec)
        for start in (int(s) for s in a.starts.split(",")):
            jobs, _ = window_jobs(raw, cluster, load, start, a.size, a.seed)
            config = SimConfig(
                cycle_interval=60.0, restart_overhead=60.0, checkpointing=True, plan_waits=True
            )
            for name, kind, window, cens in product(
                a.policies.split(","), runtimes, windows, censored
            ):
                driver = EtaDriver(
                    get_policy(name),
                    arrivals_window=window,
                    censored=cens,
                    shown_every=a.shown_every,
                    runtimes=None if kind == "policy" else kind.rstrip("0123456789"),
                    samples=int(kind[len(kind.rstrip("0123456789")) :] or 1),
                )
                t0 = time.perf_counter()
                result = simulate(jobs, cluster, driver, config, predictor=make_predictor())
                m = eta_metrics(result, driver)
                spans = [
                    r.finish - r.spec.submit
                    for r in result.state.jobs.values()
                    if r.finish is not None
                ]
                jct = sum(spans) / max(len(spans), 1)
                print(
                    f"{scen:10} {start:>6} {name:13} {kind:9} {window:>8.0f} {cens:>4d} {m['eta_jobs']:>5} {m['eta_waited']:>6} "
                    f"{m['eta_median_abs_error_share']:>8.1%} {m['eta_p90_abs_error_share']:>8.1%} "
                    f"{m['eta_median_abs_error_s']:>9.0f} {m['eta_band_coverage']:>8.1%} "
                    f"{m['eta_band_coverage_all']:>7.1%} "
                    f"{m['eta_none_share']:>6.1%} {jct:>9.0f} {m['eta_forecast_seconds']:>6.1f}"
                    + (
                        f" {m['eta_shown_samples']:>7} {m['eta_shown_median_abs_error_share']:>7.1%}"
                        f" {m['eta_shown_band_coverage']:>6.1%}"
                        if a.shown_every
                        else ""
                    )
                    + f"   ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
