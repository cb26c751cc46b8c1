"""Simulator speed: replay the whole Philly trace (82k jobs) under one policy.

Jobs over 8 GPUs are dropped (`--gangs` keeps them as multi-node gangs of 8-GPU members,
with host CPUs/memory asked and nodes in groups of 4); the cluster is sized so the trace's own
arrival rate offers 70% load (no rescaling), so the queue behaves like a busy real cluster. Prints jobs per
second of wall time, the share spent inside the policy, and the time for the whole trace
(target <= 30 s; Alibaba's PAI simulator reports 52-111 s for 20k jobs).

    nice .venv/bin/python bench/bench_sim_throughput.py                 # whole trace, priority
    .venv/bin/python bench/bench_sim_throughput.py --jobs 10000         # first 10k jobs
    .venv/bin/python bench/bench_sim_throughput.py --policy fcfs --cycle 30
    .venv/bin/python bench/bench_sim_throughput.py --jobs 3000 --plain   # pre-change path
Reports wall and CPU seconds (time.process_time); the machine may be shared, so compare
CPU seconds, and compare against a `--plain` run (every cycle asked, wait sentences built,
no shortcuts: the path before those existed) of the same jobs.
Not a test.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.sim.cluster import parse_cluster  # noqa: E402
from scheduler.sim.metrics import compute_metrics  # noqa: E402
from scheduler.sim.runner import run_one  # noqa: E402
from scheduler.sim.sources import load_philly  # noqa: E402
from scheduler.sim.state import SimConfig  # noqa: E402
from scheduler.sim.transform import offered_load, prepare  # noqa: E402

TRACE = ROOT / "bench" / "traces" / "philly.csv"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--policy", default="priority")
    p.add_argument("--jobs", type=int, help="replay only the first N jobs")
    p.add_argument("--load", type=float, default=0.7, help="size the cluster for this load")
    p.add_argument("--cycle", type=float, default=60.0)
    p.add_argument(
        "--skip-when-full",
        action="store_true",
        help="skip cycles while no pending job fits even where the policy may preempt",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="reference path: no cycle skipping, wait sentences built, no policy shortcuts",
    )
    p.add_argument("--backoff", type=float, default=8.0, help="idle timer-cycle backoff cap")
    p.add_argument("--gangs", action="store_true", help="keep jobs over 8 GPUs as multi-node gangs")
    a = p.parse_args()
    t0 = time.perf_counter()
    raw = [j for j in load_philly(a.trace) if a.gangs or j.gpus <= 8]
    if a.jobs:
        raw = raw[: a.jobs]
    load_s = time.perf_counter() - t0
    nodes = math.ceil(offered_load(raw, 8) / a.load)
    cluster = parse_cluster(
        f"{nodes}x8xV100[cpus=64,mem=512,group=4]" if a.gangs else f"{nodes}x8xV100"
    )
    t1 = time.perf_counter()
    jobs, _ = prepare(
        raw,
        total_gpus=cluster.total_gpus,
        max_node_gpus=8,
        cluster=cluster,
        cpus_per_gpu=4.0 if a.gangs else 0.0,
        memory_gb_per_gpu=32.0 if a.gangs else 0.0,
    )
    prep_s = time.perf_counter() - t1
    print(
        f"{len(jobs)} jobs, cluster {cluster.text} ({cluster.total_gpus} GPUs), offered load "
        f"{offered_load(jobs, cluster.total_gpus):.2f}; load {load_s:.1f} s, prepare {prep_s:.1f} s"
    )
    config = SimConfig(
        cycle_interval=a.cycle,
        cycle_backoff=a.backoff,
        skip_when_full=a.skip_when_full,
        skip_exact=not a.plain,
        explain=a.plain,
        plan_waits=a.plain,
        settings={"fast_paths": False} if a.plain else {},
    )
    cpu0 = time.process_time()
    result, m = run_one(a.policy, jobs, cluster, config, progress=True)
    cpu = time.process_time() - cpu0
    wall = result.wall_seconds
    sim_only = wall - result.policy_seconds
    print(
        f"policy {a.policy}: {wall:.1f} s simulated replay, {len(jobs) / wall:,.0f} jobs/s; "
        f"{result.cycles:,} cycles, {result.policy_seconds:.1f} s in the policy "
        f"({result.policy_seconds / wall:.0%}), {sim_only:.1f} s in the simulator; "
        f"{cpu:.1f} s CPU"
    )
    print(
        f"whole run incl. loading: {time.perf_counter() - t0:.1f} s (target <= 30 s); "
        f"per cycle {1e3 * result.policy_seconds / max(1, result.cycles):.2f} ms policy"
    )
    policy_cpu = result.policy_cpu_seconds
    print(
        f"CPU: {policy_cpu:.1f} s in the policy ({1e3 * policy_cpu / max(1, result.cycles):.2f} "
        f"ms per cycle), {cpu - policy_cpu:.1f} s in the simulator"
    )
    m = compute_metrics(result)
    print(
        f"avg JCT {m['jct_avg']:,.0f} s, avg wait {m['queue_avg']:,.0f} s, util "
        f"{m['utilization']:.2f}, finished {m['finished']}/{m['jobs']}"
    )


if __name__ == "__main__":
    main()
