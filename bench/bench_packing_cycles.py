"""Packing policies in cycles, for bench_packing.py (`--policies`, `--cycle`).

`--policies greedy,ilp,genetic,annealing`: requests arrive `--batch` at a time; each cycle
the policy plans for every request still waiting on a snapshot of what is free, its places
are booked, and the run stops after the first cycle that leaves a request waiting.
`--cycle fcfs,priority`: bench_cycle_pure's snapshot timed with placement best_fit and
fragmentation in the same run. Run through bench_packing.py (see its docstring).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_packing import (
    Row,
    build_fleet,
    fleet_state,
    measure,
    print_rows,
    requests,
)

from scheduler.core.model import GpuState, NodeState, PendingJob
from scheduler.core.placement import FreeCapacity


def snapshot_of(cap: FreeCapacity, fleet: tuple[NodeState, ...], pending: list[PendingJob]):  # type: ignore[no-untyped-def]
    """What a cycle sees: each GPU's free memory and compute, and the waiting requests."""
    from scheduler.core.model import Snapshot

    nodes = []
    for n in fleet:
        gpus = []
        for g in n.gpus:
            mem, comp = cap.free_on(n.name, g.index)
            gpus.append(GpuState(g.index, g.model, g.memory_mb, mem, comp))
        nodes.append(NodeState(n.name, tuple(gpus)))
    return Snapshot(now=float(len(pending)), nodes=tuple(nodes), pending=tuple(pending))


def run_cycles(
    name: str, fleet: tuple[NodeState, ...], mix: list[PendingJob], batch: int, seed: int
) -> tuple[Row, int, int, int, float]:
    """Row measures (as run_one), cycles, cycles the ILP solved (optimal or stopped at a
    work limit with a solution), cycles it kept greedy's plan, CPU s per cycle."""
    from scheduler.policies import get_policy
    from scheduler.policies.packing.ilp import IlpPolicy

    cap = FreeCapacity(fleet)
    by_id = {j.id: j for j in mix}
    arrived = placed = cycles = solved = kept = 0
    waiting: list[PendingJob] = []
    cpu = 0.0
    params = {"seed": seed} if name in ("genetic", "annealing") else {}
    policy = get_policy(name, **params)
    while arrived < len(mix):
        waiting += mix[arrived : arrived + batch]
        arrived += batch
        snapshot = snapshot_of(cap, fleet, waiting)
        t0 = time.process_time()
        plan = policy.schedule(snapshot)
        cpu += time.process_time() - t0
        cycles += 1
        if isinstance(policy, IlpPolicy):
            last = policy.last
            solved += last is not None and last.status in ("optimal", "feasible")
            kept += any("kept greedy's plan" in n for n in plan.notes)
        done = set()
        for place in plan.places:
            cap.take(by_id[place.job_id], place.node, place.gpu_indices)
            done.add(place.job_id)
        placed += len(done)
        waiting = [j for j in waiting if j.id not in done]
        if waiting:
            break
    allocated, stranded, slivers, shared = measure(fleet_state(cap, fleet), mix)
    row = (allocated, stranded, slivers, shared, placed, cpu)
    return row, cycles, solved, kept, cpu / max(cycles, 1)


def policy_rows(args: argparse.Namespace) -> None:
    names = args.policies.split(",")
    rows: dict[str, list[Row]] = {n: [] for n in names}
    extra: dict[str, list[tuple[int, int, int, float]]] = {n: [] for n in names}
    for seed in range(1, args.policy_seeds + 1):
        fleet = build_fleet(args.nodes, seed)
        gpus = sum(len(n.gpus) for n in fleet)
        mix = requests(4 * gpus, seed, fleet, args.named)
        line = [f"seed {seed}: {len(fleet)} nodes, {gpus} GPUs, batch {args.batch}"]
        for name in names:
            row, cycles, solved, kept, per_cycle = run_cycles(name, fleet, mix, args.batch, seed)
            rows[name].append(row)
            extra[name].append((cycles, solved, kept, per_cycle))
            line.append(f"{name}/cycle {row[1] * 100:.2f}%")
        print("; ".join(line), flush=True)

    def rest(name: str, r: list[Row]) -> str:
        e = extra[name]
        cycles, solved, kept = (sum(x[i] for x in e) for i in range(3))
        ilp = name == "ilp"
        return (
            f" {statistics.mean(x[2] for x in r):8.0f} {statistics.mean(x[4] for x in r):7.0f}"
            f" {cycles:7d} {(str(solved) if ilp else '-'):>10} {(str(kept) if ilp else '-'):>11}"
            f" {statistics.mean(x[3] for x in e):12.2f}"
        )

    print_rows(
        ("policy", 16),
        f" {'slivers':>8} {'placed':>7} {'cycles':>7} {'ilp solved':>10} {'kept greedy':>11}"
        f" {'CPU s/cycle':>12}",
        {f"{name}/cycle": (rows[name], rest(name, rows[name])) for name in names},
    )
    print(
        "mean ± standard deviation over seeds; ilp solved: cycles the solver returned a plan"
        " (optimal, or the best found at a work limit), no fallback; kept greedy: cycles"
        " where greedy's plan scored higher on the solver's objective and was kept (noted)"
    )


def cycle_cost(policies: list[str], repeat: int) -> None:
    """bench_cycle_pure's snapshot (1,000 nodes x 8 GPUs, 10,000 pending), timed with
    settings "placement" best_fit and fragmentation in the same run."""
    from dataclasses import replace
    from types import MappingProxyType

    from bench_cycle_pure import build_snapshot, time_policy

    snapshot = build_snapshot()
    print(f"{'policy':<10} {'best_fit ms CPU':>16} {'fragmentation ms CPU':>21} {'x':>6}")
    for name in policies:
        times = []
        for mode in ("best_fit", "fragmentation"):
            s = replace(snapshot, settings=MappingProxyType({"placement": mode}))
            times.append(time_policy(name, s, repeat)[0] * 1e3)
        print(f"{name:<10} {times[0]:16.1f} {times[1]:21.1f} {times[1] / times[0]:6.2f}")
