"""Policy quality on the Philly trace: every policy, the same jobs, ratios to FIFO and oracle.

Recipe: jobs over a node's GPUs are kept as multi-node gangs of node-size members (as
Philly's multi-server jobs were); only jobs that can never fit the cluster are dropped
(counted and printed); every job asks 4 host CPUs and 32 GiB of host memory per GPU of each
member; nodes have 64 CPUs and 512 GiB (8 GPUs) or 32 and 256 (4 GPUs) and form topology
groups of 4 nodes; a gang spread over two groups runs 10% slower per extra group
(`--gang-spread-slowdown`). `--oversize drop` restores the old recipe (jobs over 8 GPUs
dropped before choosing windows). Sort by submit; windows of 2,000 consecutive jobs starting
at jobs 0, 20,000 and 40,000; each shifted to start at 0 with arrivals scaled so the offered
load (GPU-seconds / (GPUs x span)) is 70% of the cluster; time limits from the seeded
over-asking model (median 2x); preemption costs a 60 s restart of a checkpointed job (it
resumes where it stopped, as Tiresias and Gandiva assume of DL jobs). The preemptive policies
(--no-checkpoint, default las, gittins and tiresias) also run once more with preemption losing
all progress of the attempt, as extra rows named "NAME/no-ckpt"; they compete for the best of
the no-checkpoint summary line with the rows that never preempted. Policies are told what a
preemption costs through the settings they read in production (preemption_checkpoints,
preemption_restart_overhead): checkpointed rows say checkpoints are continuous, no-ckpt
rows say there are none.
Scenarios: 8x8 GPUs at 70%, 16x4 at 70%, 8x8 at 90%, 64x8 at 70% (load relative to that
cluster). Besides JCT: preemptions per job, GPU-hours lost to restarts (and their share of
all GPU-hours held), and the share of GPU-time lost to gang waits (GPUs idle while the oldest
waiting job is a multi-node gang). Targets (issue 12): best within 1.25x of srpt-oracle and
at least 20% below tiresias, checkpointed and not; preemptions per job <= 1; lost <= 2%.

Heterogeneous scenarios (not in the default list; `--scenarios mix@0.45`): V100, P100 and
K80 nodes, every job given a type drawn (seeded by --seed) from Gavel's published throughputs
and runs at that type's speed on each model (scheduler.sim.transform.assign_speeds); the
load is relative to the cluster's GPU count at V100 speed. `gavel` runs twice: with the
speeds declared (as Gavel assumes them profiled) and as "gavel/learned", where policies see
only what finished jobs teach (SimConfig.declare_speeds off). A second table gives makespan
and the work done per GPU-second held (useful / busy: 1.0 when every job ran on its fastest
model and lost nothing).

    nice .venv/bin/python bench/bench_policy_quality.py            # everything (long)
    .venv/bin/python bench/bench_policy_quality.py --quick         # 1 window, 500 jobs
    .venv/bin/python bench/bench_policy_quality.py --policies fcfs,sjf --scenarios 8x8@0.7,16x4@0.7
    nice .venv/bin/python bench/bench_policy_quality.py --scenarios mix@0.45 --size 800 \
        --policies gavel,gittins,las,tiresias,priority,fcfs,srpt-oracle --no-checkpoint ''
Prints figures; --json FILE also saves them. Not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.sim.cluster import parse_cluster  # noqa: E402
from scheduler.sim.metrics import ratios  # noqa: E402
from scheduler.sim.runner import all_names, run_many  # noqa: E402
from scheduler.sim.sources import load_philly  # noqa: E402
from scheduler.sim.state import SimConfig  # noqa: E402
from scheduler.sim.transform import assign_speeds, prepare  # noqa: E402

TRACE = ROOT / "bench" / "traces" / "philly.csv"
SCENARIOS = {
    "8x8@0.7": ("8x8xV100[cpus=64,mem=512,group=4]", 0.7),
    "16x4@0.7": ("16x4xV100[cpus=32,mem=256,group=4]", 0.7),
    "8x8@0.9": ("8x8xV100[cpus=64,mem=512,group=4]", 0.9),
    "64x8@0.7": ("64x8xV100[cpus=64,mem=512,group=4]", 0.7),
}
_HOST = "[cpus=64,mem=512,group=4]"
# Mixed GPU models; jobs get speeds per model (see the module docstring).
HETERO_SCENARIOS = {
    "mix@0.45": (f"3x8xV100{_HOST}+2x8xP100{_HOST}+3x8xK80{_HOST}", 0.45),
    "mix@0.6": (f"3x8xV100{_HOST}+2x8xP100{_HOST}+3x8xK80{_HOST}", 0.6),
}
LEARNED = "/learned"
CPUS_PER_GPU = 4.0
MEMORY_GB_PER_GPU = 32.0
REALISTIC_EXCLUDE = {"srpt-oracle"}
NO_CKPT = "/no-ckpt"


def window_jobs(raw: list, cluster: Any, load: float, start: int, size: int, seed: int) -> Any:
    """The recipe's jobs for one window on one cluster: (jobs, report). Jobs that can never
    fit (here: 128 GPUs, on either 64-GPU cluster) are dropped before the window is chosen,
    as zero-length jobs are."""
    return prepare(
        raw,
        window=f"{start}:{start + size}",
        total_gpus=cluster.total_gpus,
        max_node_gpus=cluster.max_node_gpus,
        load=load,
        seed=seed,
        cluster=cluster,
        cpus_per_gpu=CPUS_PER_GPU,
        memory_gb_per_gpu=MEMORY_GB_PER_GPU,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--starts", default="0,20000,40000")
    p.add_argument("--size", type=int, default=2000)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--policies", default="all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-checkpoint",
        default="las,gittins,tiresias",
        help="policies also run without checkpointing (extra rows); '' for none",
    )
    p.add_argument(
        "--checkpointing",
        choices=("on", "off"),
        default="on",
        help="whether preempted jobs keep their progress in the main rows (default on)",
    )
    p.add_argument(
        "--oversize",
        choices=("gang", "drop"),
        default="gang",
        help="jobs over a node's GPUs: multi-node gangs (default) or dropped (old recipe)",
    )
    p.add_argument("--gang-spread-slowdown", type=float, default=0.1)
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="a scheduler setting for every policy, e.g. preemption_cost_weight=3",
    )
    p.add_argument("--quick", action="store_true", help="first window only, 500 jobs, 8x8@0.7")
    p.add_argument("--json", help="also write all figures here")
    a = p.parse_args()
    if a.quick:
        a.starts, a.size, a.scenarios = "0", 500, "8x8@0.7"
    names = all_names() if a.policies == "all" else a.policies.split(",")
    t0 = time.perf_counter()
    raw = load_philly(a.trace)
    if a.oversize == "drop":
        raw = [j for j in raw if j.gpus <= 8]  # the old recipe drops them before the windows
    big = sum(j.gpus > 8 for j in raw)
    print(f"trace: {len(raw)} jobs, {big} over 8 GPUs ({time.perf_counter() - t0:.1f} s to load)")
    everything: dict = {}
    summary = []
    for scen in a.scenarios.split(","):
        hetero = scen in HETERO_SCENARIOS
        spec, load = HETERO_SCENARIOS[scen] if hetero else SCENARIOS[scen]
        cluster = parse_cluster(spec)
        for start in (int(s) for s in a.starts.split(",")):
            jobs, rep = window_jobs(raw, cluster, load, start, a.size, a.seed)
            if hetero:
                jobs = assign_speeds(jobs, seed=a.seed)
            config = SimConfig(
                cycle_interval=60.0,
                restart_overhead=60.0,
                checkpointing=a.checkpointing == "on",
                gang_spread_slowdown=a.gang_spread_slowdown,
                settings=_settings(a.setting, a.checkpointing == "on"),
            )
            t1 = time.perf_counter()
            metrics, _ = run_many(names, jobs, cluster, config, seed=a.seed)
            extra = [n for n in a.no_checkpoint.split(",") if n and n in names]
            if extra and a.checkpointing == "on":
                lossy = replace(config, checkpointing=False, settings=_settings(a.setting, False))
                more, _ = run_many(extra, jobs, cluster, lossy, seed=a.seed)
                for n, m in more.items():
                    # srpt-oracle and fcfs never lose progress: the main rows are their refs.
                    for ref, key in (("srpt-oracle", "vs_oracle"), ("fcfs", "vs_fcfs")):
                        if "error" not in m and "error" not in metrics.get(ref, {"error": 1}):
                            m[key] = ratios(m, metrics[ref])
                    metrics[n + NO_CKPT] = m
            if hetero and "gavel" in names:
                hidden = replace(config, declare_speeds=False)
                more, _ = run_many(["gavel"], jobs, cluster, hidden, seed=a.seed)
                for ref, k in (("srpt-oracle", "vs_oracle"), ("fcfs", "vs_fcfs")):
                    if "error" not in more["gavel"] and "error" not in metrics.get(
                        ref, {"error": 1}
                    ):
                        more["gavel"][k] = ratios(more["gavel"], metrics[ref])
                metrics["gavel" + LEARNED] = more["gavel"]
            key = f"{scen} window {start}"
            everything[key] = metrics
            everything[key + " prep"] = rep.as_dict()
            print(
                f"\n== {key}: {len(jobs)} jobs ({sum(j.nodes > 1 for j in jobs)} multi-node "
                f"gangs; {rep.dropped_unfit} of the trace dropped: can never fit), "
                f"{cluster.total_gpus} GPUs, offered "
                f"load {rep.offered_load:.2f}, arrivals x{rep.arrival_scale:.2f} "
                f"({time.perf_counter() - t1:.0f} s)"
            )
            print(
                f"{'policy':<16}{'avg JCT':>11}{'p95 JCT':>11}{'p99 JCT':>11}{'avg wait':>10}"
                f"{'util':>6}{'pre/job':>8}{'lost GPU-h':>11}{'lost %':>7}{'gang wait':>10}"
                f"{'gang JCT':>10}"
                f"{'jain':>6}{'/fcfs':>7}{'/oracle':>8}{'pred err':>9}{'wall s':>7}"
            )
            for name, m in metrics.items():
                if "error" in m:
                    print(f"{name:<16} error: {m['error']}")
                    continue
                vf = (m.get("vs_fcfs") or {}).get("jct_avg")
                vo = (m.get("vs_oracle") or {}).get("jct_avg")
                pe = m.get("prediction_mare")
                print(
                    f"{name:<16}{m['jct_avg']:>11,.0f}{m['jct_p95']:>11,.0f}{m['jct_p99']:>11,.0f}"
                    f"{m['queue_avg']:>10,.0f}{m['utilization']:>6.2f}"
                    f"{m['preemptions_per_job']:>8.3f}{m['lost_gpu_hours']:>11,.1f}"
                    f"{100 * m.get('lost_share', 0.0):>7.2f}"
                    f"{m['gang_wait_share']:>10.3f}{m['gang_jct_avg']:>10,.0f}"
                    f"{m['jain_slowdown']:>6.2f}{vf or 0:>7.3f}{vo or 0:>8.3f}"
                    f"{(pe if pe is not None else float('nan')):>9.2f}{m['wall_seconds']:>7.1f}"
                )
            if hetero:
                _print_hetero(metrics)
            ok = {n: m for n, m in metrics.items() if "error" not in m}
            real = {n: m for n, m in ok.items() if n not in REALISTIC_EXCLUDE and NO_CKPT not in n}
            if real and "srpt-oracle" in ok and "fcfs" in ok:
                best = min(real, key=lambda n: real[n]["jct_avg"])
                r_or = real[best]["jct_avg"] / ok["srpt-oracle"]["jct_avg"]
                r_ff = ok["fcfs"]["jct_avg"] / real[best]["jct_avg"]
                r_ti = _vs(real, best, "tiresias")
                summary.append((key, "ckpt", best, r_or, r_ff, r_ti, real[best]))
                print(
                    f"best realistic: {best}, {r_or:.2f}x oracle; fcfs / best = {r_ff:.2f}x; "
                    f"best / tiresias = {r_ti:.2f}x"
                )
                # Without checkpoints: the no-ckpt rows and the rows that never preempted.
                lossy_rows = {
                    n: m
                    for n, m in ok.items()
                    if n.endswith(NO_CKPT) or (n in real and m["preemptions"] == 0)
                }
                if any(n.endswith(NO_CKPT) for n in lossy_rows):
                    best = min(lossy_rows, key=lambda n: lossy_rows[n]["jct_avg"])
                    r_or = lossy_rows[best]["jct_avg"] / ok["srpt-oracle"]["jct_avg"]
                    r_ff = ok["fcfs"]["jct_avg"] / lossy_rows[best]["jct_avg"]
                    r_ti = _vs(lossy_rows, best, "tiresias" + NO_CKPT)
                    summary.append((key, "no-ckpt", best, r_or, r_ff, r_ti, lossy_rows[best]))
                    print(
                        f"best without checkpoints: {best}, {r_or:.2f}x oracle; "
                        f"best / tiresias{NO_CKPT} = {r_ti:.2f}x"
                    )
    if summary:
        print(
            "\n== summary (targets: best <= 1.25x oracle, best <= 0.80x tiresias, "
            "pre/job <= 1, lost <= 2%)"
        )
        for key, mode, best, r_or, r_ff, r_ti, m in summary:
            print(
                f"{key:<24}{mode:<8} best {best:<18} {r_or:6.2f}x oracle {r_ti:6.2f}x tiresias"
                f"  fcfs/best {r_ff:7.2f}x  pre/job {m['preemptions_per_job']:.3f}"
                f"  lost {100 * m.get('lost_share', 0.0):.2f}%"
            )
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(everything, indent=1, default=str))


def _settings(given: list[str], checkpointing: bool) -> dict:
    """Scheduler settings for the run: what a preemption costs, as the simulator models it
    (a 60 s restart; checkpoints continuous or none), then the --setting ones."""
    out: dict = {
        "preemption_restart_overhead": 60.0,
        "preemption_checkpoints": checkpointing,
        "preemption_checkpoint_interval": 0.0,
    }
    for item in given:
        k, _, v = item.partition("=")
        out[k] = json.loads(v)
    return out


def _print_hetero(metrics: dict) -> None:
    """Makespan and work per GPU-second held, beside avg and p95 JCT, against las."""
    ref = metrics.get("las", {})
    print(
        f"{'policy':<16}{'avg JCT':>11}{'p95 JCT':>11}{'makespan':>11}{'pre/job':>8}"
        f"{'work/held':>10}{'JCT/las':>8}"
    )
    for name, m in metrics.items():
        if "error" in m:
            continue
        busy = m.get("busy_gpu_seconds") or 0.0
        speed = m["useful_gpu_seconds"] / busy if busy else float("nan")
        vs = m["jct_avg"] / ref["jct_avg"] if ref.get("jct_avg") else float("nan")
        print(
            f"{name:<16}{m['jct_avg']:>11,.0f}{m['jct_p95']:>11,.0f}{m['makespan']:>11,.0f}"
            f"{m['preemptions_per_job']:>8.3f}{speed:>10.3f}{vs:>8.3f}"
        )


def _vs(rows: dict, best: str, ref: str) -> float:
    if ref not in rows:
        return float("nan")
    return rows[best]["jct_avg"] / rows[ref]["jct_avg"]


if __name__ == "__main__":
    main()
