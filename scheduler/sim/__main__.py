"""`python -m scheduler.sim`: replay a trace (or generated jobs) under one policy or all.

    python -m scheduler.sim --trace tests/data/philly_sample.csv --cluster 8x8xV100 \\
        --policy backfill --json
    python -m scheduler.sim --trace /path/philly.csv --format philly --cluster 8x8xV100 \\
        --policy all --window 0:2000 --load 0.7 --html report.html
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from scheduler.sim.cluster import parse_cluster
from scheduler.sim.runner import SIM_DRIVERS, all_names, run_many
from scheduler.sim.sources import FORMATS, load_jobs, synthetic
from scheduler.sim.state import SimConfig
from scheduler.sim.transform import OVERSIZE_MODES, equal_guarantees, prepare

COLUMNS = (
    ("jct_avg", "avg JCT s", "{:>10,.0f}"),
    ("jct_p95", "p95 JCT s", "{:>11,.0f}"),
    ("queue_avg", "avg wait s", "{:>10,.0f}"),
    ("makespan", "makespan s", "{:>11,.0f}"),
    ("utilization", "util", "{:>5.2f}"),
    ("preemptions", "preempt", "{:>7d}"),
    ("lost_gpu_hours", "lost GPU-h", "{:>10,.1f}"),
    ("gang_wait_share", "gang wait", "{:>9.3f}"),
    ("jain_slowdown", "jain", "{:>5.2f}"),
    ("ftf_rho_avg", "rho avg", "{:>8.2f}"),
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scheduler.sim", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="trace file (Philly CSV, generic CSV or JSON)")
    src.add_argument("--synthetic", type=int, metavar="N", help="generate N jobs instead")
    p.add_argument("--format", default="auto", choices=FORMATS)
    p.add_argument(
        "--cluster",
        default="8x8xV100",
        help="e.g. 8x8xV100, 4x8xV100+2x4xA100-80GB or 16x4xT4[cpus=32,mem=256,group=4]",
    )
    p.add_argument(
        "--nodes-per-group",
        type=int,
        help="topology groups of this many nodes (parts without their own group=)",
    )
    p.add_argument("--policy", default="fcfs", help="a policy name, a comma list, or 'all'")
    p.add_argument("--window", help="START:END job positions (0:2000) or times (2d:5d)")
    p.add_argument("--load", type=float, help="scale arrivals to this offered load (0.7)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--oversize",
        default="gang",
        choices=OVERSIZE_MODES,
        help="jobs over the largest node: multi-node gang (default), drop, or split into jobs",
    )
    p.add_argument(
        "--cpus-per-gpu",
        type=float,
        default=4.0,
        help="host CPUs a job asks per GPU when the trace gives none (0: none)",
    )
    p.add_argument(
        "--memory-gb-per-gpu",
        type=float,
        default=32.0,
        help="host memory (GiB) a job asks per GPU when the trace gives none (0: none)",
    )
    p.add_argument(
        "--gang-spread-slowdown",
        type=float,
        default=0.1,
        help="slowdown per extra node or topology group of a gang (0 disables)",
    )
    p.add_argument("--cycle", type=float, default=60.0, help="seconds between timer cycles")
    p.add_argument("--restart-overhead", type=float, default=60.0)
    p.add_argument("--checkpointing", action="store_true", help="preempted jobs keep progress")
    p.add_argument("--limit-median", type=float, default=2.0, help="median time-limit factor")
    p.add_argument(
        "--guarantee",
        default="none",
        choices=("none", "equal"),
        help="equal: every team is guaranteed an equal share of the GPUs",
    )
    p.add_argument(
        "--skip-when-full",
        action="store_true",
        help="skip cycles while no pending job fits anywhere (exact for non-preempting runs)",
    )
    p.add_argument("--no-predict", action="store_true", help="do not use the runtime predictor")
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="snapshot setting passed to policies (JSON value), repeatable",
    )
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.add_argument("--html", help="write a self-contained HTML report here")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def _settings(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--setting {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _table(metrics: dict[str, dict[str, Any]]) -> str:
    head = f"{'policy':<14}" + " ".join(
        label.rjust(len(fmt.format(0))) for _, label, fmt in COLUMNS
    )
    lines = [head + "  vs oracle  vs fcfs"]
    for name, m in metrics.items():
        if "error" in m:
            lines.append(f"{name:<14}error: {m['error']}")
            continue
        cells = []
        for key, _, fmt in COLUMNS:
            value = m.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                cells.append("-".rjust(len(fmt.format(0))))
            else:
                cells.append(fmt.format(value))
        extra = ""
        for key in ("vs_oracle", "vs_fcfs"):
            r = (m.get(key) or {}).get("jct_avg")
            extra += f"  {r:>8.2f}x" if r else "         -"
        lines.append(f"{name:<14}" + " ".join(cells) + extra)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cluster = parse_cluster(args.cluster, nodes_per_group=args.nodes_per_group)
    except ValueError as exc:
        raise SystemExit(str(exc))
    if args.trace:
        raw = load_jobs(args.trace, args.format)
    else:
        raw = synthetic(
            args.synthetic,
            total_gpus=cluster.total_gpus,
            load=args.load or 0.7,
            seed=args.seed,
            max_gpus=None,
        )
    jobs, prep = prepare(
        raw,
        total_gpus=cluster.total_gpus,
        max_node_gpus=cluster.max_node_gpus,
        window=args.window,
        load=args.load,
        oversize=args.oversize,
        seed=args.seed,
        limit_median=args.limit_median,
        cluster=cluster,
        cpus_per_gpu=args.cpus_per_gpu,
        memory_gb_per_gpu=args.memory_gb_per_gpu,
    )
    if not jobs:
        raise SystemExit("no jobs left after the window and size filters")
    names = all_names() if args.policy == "all" else [n.strip() for n in args.policy.split(",")]
    known = set(all_names())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown policy {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    config = SimConfig(
        cycle_interval=args.cycle,
        restart_overhead=args.restart_overhead,
        checkpointing=args.checkpointing,
        settings=_settings(args.setting),
        skip_when_full=args.skip_when_full,
        gang_spread_slowdown=args.gang_spread_slowdown,
        team_guaranteed=(
            equal_guarantees(jobs, cluster.total_gpus) if args.guarantee == "equal" else {}
        ),
    )
    progress = not args.quiet
    if progress:
        print(
            f"{prep.kept} jobs (loaded {prep.loaded}, {prep.ganged} multi-node gangs, dropped "
            f"{prep.dropped_unfit} that can never fit and {prep.dropped_oversize} too large, "
            f"split {prep.split_oversize}); offered load {prep.offered_load:.2f} on "
            f"{cluster.total_gpus} GPUs",
            file=sys.stderr,
        )
    metrics, results = run_many(
        names,
        jobs,
        cluster,
        config,
        seed=args.seed,
        predict=not args.no_predict,
        progress=progress,
        keep_results=bool(args.html),
    )
    if args.html:
        from scheduler.sim.report import write_html

        write_html(
            args.html,
            results,
            metrics,
            f"fleet simulator: {args.trace or 'synthetic'} on {cluster.text}",
        )
    if args.json:
        payload = {
            "cluster": cluster.text,
            "total_gpus": cluster.total_gpus,
            "prep": prep.as_dict(),
            "config": {
                "cycle_interval": config.cycle_interval,
                "restart_overhead": config.restart_overhead,
                "checkpointing": config.checkpointing,
                "gang_spread_slowdown": config.gang_spread_slowdown,
                "seed": args.seed,
            },
            "reference_drivers": sorted(SIM_DRIVERS),
            "policies": metrics,
        }
        print(json.dumps(_clean(payload), indent=2, allow_nan=False))
    else:
        print(_table(metrics))
    return 1 if any("error" in m for m in metrics.values()) else 0


def _clean(value: Any) -> Any:
    """Strict JSON: NaN and infinity become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
