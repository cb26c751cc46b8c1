"""Runtime predictions on the Philly recipe: how far each job's prediction is from its runtime.

The recipe's jobs (bench_policy_quality's time limits: each job over-asks by a seeded
lognormal factor, rounded up to a common limit) are replayed in submit order: each job is
predicted when it is submitted and learned from when it would end had it started at once,
as a cluster without queueing would teach the predictor (in a replay a queue delays the
learning; bench_policy_quality's `pred err` column is the error there). Prints, for the production
predictor (`scheduler.core.prediction`, time-limit classes) and for the same predictor
without limit classes (owner and job name alone, measured in the same run), the median and
90th percentile of |predicted - actual| / actual, the mean of |log(predicted / actual)|, and
their ratio to the one without classes. Not a test.

    .venv/bin/python bench/bench_prediction.py
    .venv/bin/python bench/bench_prediction.py --scenario 16x4@0.7 --jobs 20000
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_policy_quality import SCENARIOS, TRACE, window_jobs  # noqa: E402

from scheduler.core.prediction import RuntimePredictor  # noqa: E402
from scheduler.sim.cluster import parse_cluster  # noqa: E402
from scheduler.sim.sources import load_philly  # noqa: E402


def errors(jobs: list, predictor: RuntimePredictor) -> tuple[np.ndarray, np.ndarray]:
    """(relative errors, |log ratios|) of every job's prediction at its submit."""
    ends: list[tuple[float, int, object]] = []
    rel, logs = [], []
    for job in sorted(jobs, key=lambda j: (j.submit, j.id)):
        while ends and ends[0][0] <= job.submit:
            _, _, done = heapq.heappop(ends)
            predictor.update(done.user, done.name, done.time_limit, done.work)
        guess = predictor.predict(job.user, job.name, job.time_limit)
        rel.append(abs(guess - job.work) / job.work)
        logs.append(abs(math.log(max(guess, 1.0) / max(job.work, 1.0))))
        heapq.heappush(ends, (job.submit + job.work, job.id, job))
    return np.array(rel), np.array(logs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--scenario", default="8x8@0.7")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--jobs", type=int, default=60_000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    spec, load = SCENARIOS[a.scenario]
    jobs, _ = window_jobs(load_philly(a.trace), parse_cluster(spec), load, a.start, a.jobs, a.seed)
    jobs = [j for j in jobs if j.time_limit and j.work > 0]
    print(f"{len(jobs)} jobs of the {a.scenario} recipe from job {a.start}")
    print(
        f"{'predictor':28} {'med rel err':>11} {'p90 rel err':>11} {'mean |log|':>10} {'x base':>7}"
    )
    base = None
    for label, classes in (
        ("owner and name (baseline)", False),
        ("limit classes (production)", True),
    ):
        rel, logs = errors(jobs, RuntimePredictor(limit_classes=classes))
        med = float(np.median(rel))
        base = med if base is None else base
        print(
            f"{label:28} {med:>11.1%} {float(np.percentile(rel, 90)):>11.1%} "
            f"{float(logs.mean()):>10.3f} {med / base:>7.2f}"
        )


if __name__ == "__main__":
    main()
