"""Time one pure scheduling cycle per policy on a large synthetic fleet.

10,000 pending jobs (1/2/4/8-GPU gangs and fractions) on 1,000 nodes x 8 GPUs with about
60 % of the GPUs busy. Prints CPU milliseconds (time.process_time, best of --repeat runs;
the machine may be shared, so CPU time is steadier than wall time) per schedule() call,
wall milliseconds beside it, the ratio to the baseline policy (greedy when it exists, else
fcfs) and, for the queue-walking policies, the same cycle without shortcuts (settings
"fast_paths" false, the path before them), all measured in the same run.

    .venv/bin/python bench/bench_cycle_pure.py [--policies fcfs,priority] [--repeat 3]
    .venv/bin/python bench/bench_cycle_pure.py --pending 100000 --nodes 10000 --policies priority
    .venv/bin/python bench/bench_cycle_pure.py --scaling 1000,10000,100000 --policies priority
    .venv/bin/python bench/bench_cycle_pure.py --scaling 1000,10000,100000 --simulator
    .venv/bin/python bench/bench_cycle_pure.py --scaling 1000,10000,100000 --idle 0.01

`--scaling` times, per queue length, a cycle on a snapshot of new objects (production
builds one every cycle, so nothing carried over applies), the next cycle of a driver that
carries its objects over (the simulator: a minute later, the placed jobs gone, ten new
ones queued) and the plain path, all in the same run; with `--simulator`, under the
simulator's settings (no wait sentences, no Waits in the plan), as a replay's cycles run.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from importlib import import_module
from pathlib import Path
from types import MappingProxyType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.core.model import (  # noqa: E402
    GpuState,
    NodeState,
    PendingChanges,
    PendingJob,
    RunningChanges,
    RunningJob,
    Snapshot,
    TeamState,
)
from scheduler.policies import POLICIES, get_policy  # noqa: E402

MODELS = (("A100", 81920), ("H100", 81920), ("V100", 32768))
TEAMS = tuple(f"team{i}" for i in range(12))


def build_snapshot(
    nodes: int = 1000, pending: int = 10_000, seed: int = 1, idle: float | None = None
) -> Snapshot:
    """The synthetic fleet and queue; `idle`: the share of GPUs left free (about; the
    default leaves 40 % free and shares 10 %, a burst of starts; a small share is the
    steady state of a busy fleet, where a cycle starts what the last few ends freed)."""
    rng = random.Random(seed)
    gang_below, shared_below = (0.5, 0.6) if idle is None else (0.84 * (1 - idle), 1 - idle)
    now = 1_000_000.0
    node_states, running = [], []
    job_id = 0
    for n in range(nodes):
        model, mem = MODELS[n % len(MODELS)]
        free_mem, free_comp = [mem] * 8, [100] * 8
        name = f"node{n:04d}"
        g = 0
        while g < 8:
            roll = rng.random()
            if roll < gang_below:  # a running gang
                size = min(rng.choice((1, 1, 2, 4)), 8 - g)
                idx = tuple(range(g, g + size))
                for i in idx:
                    free_mem[i], free_comp[i] = 0, 0
                job_id += 1
                running.append(_running(rng, job_id, name, idx, size, now))
                g += size
            elif roll < shared_below:  # fractions sharing a GPU
                # (a busy fleet's shared GPUs are full: fractions until 10 % is left)
                for _ in range(rng.randint(1, 3) if idle is None else 12):
                    m, c = rng.choice((4096, 8192, 16384)), rng.choice((10, 20, 30))
                    if idle is not None and free_comp[g] - c < 10:
                        c = free_comp[g] - 10
                    if m <= free_mem[g] and c <= free_comp[g]:
                        free_mem[g] -= m
                        free_comp[g] -= c
                        job_id += 1
                        r = _running(rng, job_id, name, (g,), 0, now)
                        running.append(_fraction(r, m, c))
                g += 1
            else:
                g += 1
        gpus = tuple(GpuState(i, model, mem, free_mem[i], free_comp[i]) for i in range(8))
        node_states.append(NodeState(name, gpus))
    jobs = []
    for _ in range(pending):
        job_id += 1
        shape = rng.random()
        limit = float(rng.choice((600, 3600, 4 * 3600, 24 * 3600)))
        common: dict[str, Any] = dict(
            id=job_id,
            team=rng.choice(TEAMS),
            user=f"u{rng.randrange(60)}",
            submitted_at=now - rng.uniform(0, 86400),
            time_limit=limit,
            priority=rng.randint(0, 10),
            qos=rng.choice(("low", "normal", "normal", "high")),
            predicted_runtime=limit * rng.uniform(0.1, 1.0),
            attained_service=rng.choice((0.0, 0.0, 5000.0, 50_000.0)),
            gpu_model=rng.choice((None, None, None, "A100", "H100")),
        )
        if shape < 0.2:
            jobs.append(
                PendingJob(
                    gpus=0,
                    gpu_memory_mb=rng.choice((4096, 8192, 16384, 24576)),
                    gpu_compute_percent=rng.choice((10, 25, 50)),
                    **common,
                )
            )
        else:
            jobs.append(PendingJob(gpus=rng.choice((1, 1, 1, 2, 2, 4, 8)), **common))
    # Guarantees, hard limits and user caps grow with the fleet (400, 2,000 and 64 GPUs at
    # 1,000 nodes), so a larger fleet is not all over its teams' limits.
    scale = max(nodes, 1) / 1000
    teams = {
        t: TeamState(
            t,
            guaranteed_gpus=round(400 * scale),
            hard_limit_gpus=round(2000 * scale),
            user_gpu_cap=round(64 * scale),
            priority_weight=rng.choice((1.0, 2.0)),
            fairshare_weight=rng.choice((1.0, 2.0, 3.0)),
            decayed_usage=rng.uniform(0, 1e7),
        )
        for t in TEAMS
    }
    return Snapshot(
        now=now,
        nodes=tuple(node_states),
        running=tuple(running),
        pending=tuple(jobs),
        teams=MappingProxyType(teams),
        settings=MappingProxyType({}),
    )


def _running(rng: random.Random, job_id: int, node: str, idx, gpus: int, now: float) -> RunningJob:
    return RunningJob(
        id=job_id,
        team=rng.choice(TEAMS),
        user=f"u{rng.randrange(60)}",
        node=node,
        gpu_indices=idx,
        started_at=now - rng.uniform(0, 20_000),
        time_limit=float(rng.choice((3600, 4 * 3600, 24 * 3600))),
        gpus=gpus,
    )


def _fraction(r: RunningJob, mem: int, comp: int) -> RunningJob:
    from dataclasses import replace

    return replace(r, gpus=0, gpu_memory_mb=mem, gpu_compute_percent=comp)


def available(name: str) -> bool:
    try:
        import_module(POLICIES[name].partition(":")[0])
    except ImportError:
        return False
    return True


def time_policy(name: str, snapshot: Snapshot, repeat: int) -> tuple[float, float, int]:
    """(best CPU seconds, best wall seconds, jobs placed)."""
    params = {"seed": 1}
    try:
        policy = get_policy(name, **params)
    except TypeError:
        policy = get_policy(name)
    best_cpu, best_wall, placed = float("inf"), float("inf"), 0
    for _ in range(repeat):
        cpu, wall = time.process_time(), time.perf_counter()
        plan = policy.schedule(snapshot)
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
        placed = len(plan.places)
    return best_cpu, best_wall, placed


WALKERS = ("fcfs", "priority", "sjf", "fairshare", "backfill", "las")


def fresh_copy(snapshot: Snapshot) -> Snapshot:
    """The same snapshot made of new objects, as production builds one every cycle: no
    state carried from an earlier cycle applies to it (caches keyed by object miss)."""
    return replace(
        snapshot,
        nodes=tuple(replace(n) for n in snapshot.nodes),
        running=tuple(replace(r) for r in snapshot.running),
        pending=tuple(replace(j) for j in snapshot.pending),
    )


def next_snapshot(snapshot: Snapshot, placed: set[int], arrivals: int, seed: int) -> Snapshot:
    """The next cycle as a driver that carries its objects over sees it (the simulator):
    a minute later, the jobs just placed gone from the queue, a few new ones queued, the
    running jobs and nodes the same objects."""
    rng = random.Random(seed)
    top = max(j.id for j in snapshot.pending) if snapshot.pending else 0
    template = snapshot.pending[0]
    new = [
        replace(template, id=top + 1 + i, submitted_at=snapshot.now + rng.uniform(0, 60))
        for i in range(arrivals)
    ]
    pending = tuple(j for j in snapshot.pending if j.id not in placed) + tuple(new)
    # What changed, as the simulator says it with every snapshot (the running jobs are
    # the same objects: this cycle's starts are not added, to keep the fleet as it was).
    changes = PendingChanges(
        snapshot.pending, tuple(new), tuple(j for j in snapshot.pending if j.id in placed)
    )
    return replace(
        snapshot,
        now=snapshot.now + 60.0,
        pending=pending,
        pending_changes=changes,
        running_changes=RunningChanges(snapshot.running, (), ()),
    )


def cycle_cpu(
    policy: Any, snapshot: Snapshot, repeat: int, warm: Snapshot | None
) -> tuple[float, int]:
    """Best CPU seconds of schedule(snapshot), and the jobs its plan places; with `warm`,
    each try first schedules that snapshot (untimed), so state carried across cycles is as
    after the cycle before."""
    best, placed = float("inf"), 0
    for _ in range(repeat):
        if warm is not None:
            policy.schedule(warm)
        else:
            snapshot = fresh_copy(snapshot)
        cpu = time.process_time()
        plan = policy.schedule(snapshot)
        best = min(best, time.process_time() - cpu)
        placed = len(plan.places)
    return best, placed


# The settings the simulator schedules with: no wait sentences, no Waits in the plan.
SIMULATOR = {"explain": False, "plan_waits": False}


def scaling(
    names: list[str],
    nodes: int,
    sizes: list[int],
    repeat: int,
    extra: dict[str, Any],
    idle: float | None = None,
) -> None:
    """Per queue length: a cycle on a snapshot of new objects (what production does every
    cycle), the next cycle of a driver that carries its objects over, and the plain path
    (settings "fast_paths" false, new objects), all in the same run; `extra`: settings
    for all three (the simulator's, or none: production's). "placed" is what the first
    cycle places, "c.placed" what the carried one does: a longer queue holds more jobs
    that fit the fleet's slivers, so its carried cycle may start more (more work, not a
    cost of the queue's length), and "ms/c.placed" with its ratio to the first length's
    tells the two apart."""
    print(
        f"{'policy':<10} {'pending':>8} {'new objs ms':>12} {'carried ms':>11} "
        f"{'plain ms':>9} {'plain/carried':>14} {'carried/first':>14} {'placed':>7} "
        f"{'c.placed':>9} {'ms/c.placed':>12} {'x first':>8}"
    )
    for name in names:
        first: float | None = None
        first_each: float | None = None
        for size in sizes:
            base = build_snapshot(nodes, size, idle=idle)
            base = replace(base, settings=MappingProxyType(dict(extra)))
            policy = get_policy(name)
            plan = policy.schedule(base)
            placed = len(plan.places)
            follow = next_snapshot(base, {p.job_id for p in plan.places}, 10, seed=size)
            cold, _ = cycle_cpu(policy, base, repeat, None)
            carried, carried_placed = cycle_cpu(policy, follow, repeat, base)
            plain_snap = replace(base, settings=MappingProxyType({**extra, "fast_paths": False}))
            plain, _ = cycle_cpu(get_policy(name), plain_snap, repeat, None)
            first = first or carried
            each = carried / max(1, carried_placed)
            first_each = first_each or each
            print(
                f"{name:<10} {size:>8} {cold * 1e3:12.1f} {carried * 1e3:11.1f} "
                f"{plain * 1e3:9.1f} {plain / carried:14.2f} {carried / first:14.2f} {placed:7d} "
                f"{carried_placed:9d} {each * 1e3:12.3f} {each / first_each:8.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument(
        "--scaling",
        help="queue lengths (e.g. 1000,10000,100000): per length, a cycle on new objects, "
        "the next cycle with objects carried over, and the plain path, in one run",
    )
    parser.add_argument(
        "--simulator",
        action="store_true",
        help="with --scaling: schedule with the simulator's settings (no wait sentences, "
        "no Waits in the plan) instead of production's",
    )
    parser.add_argument(
        "--idle",
        type=float,
        help="share of the fleet's GPUs left free (default: 40 %% free, a burst of starts; "
        "e.g. 0.01: the steady state of a busy fleet, where a cycle starts a few jobs)",
    )
    args = parser.parse_args()
    if args.scaling:
        names = args.policies.split(",") if args.policies != ",".join(POLICIES) else ["priority"]
        sizes = [int(x) for x in args.scaling.split(",")]
        extra = SIMULATOR if args.simulator else {}
        kind = "simulator" if args.simulator else "production"
        free = "40 %" if args.idle is None else f"{args.idle:.0%}"
        print(
            f"{args.nodes} nodes x 8 GPUs, about {free} of GPUs free, {kind} settings; "
            f"CPU ms, best of {args.repeat}"
        )
        scaling(names, args.nodes, sizes, args.repeat, extra, args.idle)
        return
    snapshot = build_snapshot(args.nodes, args.pending, idle=args.idle)
    busy = sum(1 for n in snapshot.nodes for g in n.gpus if not g.is_whole_free)
    print(
        f"{len(snapshot.pending)} pending, {len(snapshot.running)} running, "
        f"{len(snapshot.nodes)} nodes x 8 GPUs, {busy} GPUs busy or shared"
    )
    baseline = "greedy" if available("greedy") else "fcfs"
    base_time, base_wall, _ = time_policy(baseline, snapshot, args.repeat)
    print(f"baseline {baseline}: {base_time * 1000:.1f} ms CPU ({base_wall * 1000:.1f} ms wall)")
    plain = replace(snapshot, settings=MappingProxyType({"fast_paths": False}))
    print(
        f"{'policy':<10} {'ms CPU':>8} {'ms wall':>8} {'x base':>7} {'placed':>7}"
        f" {'plain ms CPU':>13} {'x plain':>8}"
    )
    for name in args.policies.split(","):
        if not available(name):
            print(f"{name:<10} {'(module missing)':>25}")
            continue
        seconds, wall, placed = time_policy(name, snapshot, args.repeat)
        line = f"{name:<10} {seconds * 1e3:8.1f} {wall * 1e3:8.1f} {seconds / base_time:7.2f} {placed:7d}"
        if name in WALKERS:
            ref, _, ref_placed = time_policy(name, plain, args.repeat)
            assert ref_placed == placed
            line += f" {ref * 1e3:13.1f} {seconds / ref:8.2f}"
        print(line)


if __name__ == "__main__":
    main()
