"""ILP packing against greedy best fit on contended fleets.

For 100, 500 and 2,000 pending jobs on 32, 64 and 128 nodes of 8 GPUs (about half busy,
some GPUs partly used by fractions; pending demand several times what is free), prints:
greedy's time and value; the ILP's model size (variables, rows, slot and GPU classes),
solve status (solved / fell back / kept greedy's plan), branch-and-bound nodes and time,
its plan's value, the LP-relaxation bound and HiGHS's dual bound, and the optimality gap
of the plan against those bounds; the value ratio ILP/greedy; for each plan the stranded
share (free GPU compute no pending request shape could use, of all GPUs). Also the
genetic and annealing policies on the same snapshots. `--nodes 2000` puts every size on
2,000 nodes.

    .venv/bin/python bench/bench_ilp.py [--time-limit 10] [--seed 0] [--sizes 100,500,2000]
        [--nodes 2000] [--no-search]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.core.model import (  # noqa: E402
    GpuState,
    NodeState,
    PendingJob,
    RunningJob,
    Snapshot,
    TeamState,
)
from scheduler.policies import get_policy  # noqa: E402
from scheduler.policies.packing._ilp_model import Limits, solve  # noqa: E402
from scheduler.policies.packing._values import job_values  # noqa: E402
from scheduler.policies.packing.ilp import IlpPolicy  # noqa: E402

SCALES = {100: 32, 500: 64, 2000: 128}  # pending jobs -> nodes of 8 GPUs
TEAMS = ("vision", "nlp", "speech", "rl")


def contended_fleet(pending: int, nodes: int, seed: int) -> Snapshot:
    rng = random.Random(seed)
    fleet, running = [], []
    run_id = 1_000_000
    for n in range(nodes):
        model, memory = ("a100", 81_920) if n % 4 else ("v100", 32_768)
        gpus = []
        for i in range(8):
            roll = rng.random()
            team, user = rng.choice(TEAMS), f"u{rng.randrange(12)}"
            if roll < 0.45:
                gpus.append(GpuState(i, model, memory, 0, 0))
                running.append(RunningJob(run_id, team, user, f"n{n:04d}", (i,), 0.0, 86400.0))
            elif roll < 0.6:
                mem, comp = rng.randrange(4, 24) * 1024, rng.choice([20, 25, 40, 50])
                gpus.append(GpuState(i, model, memory, memory - mem, 100 - comp))
                running.append(
                    RunningJob(
                        run_id,
                        team,
                        user,
                        f"n{n:04d}",
                        (i,),
                        0.0,
                        86400.0,
                        gpus=0,
                        gpu_memory_mb=mem,
                        gpu_compute_percent=comp,
                    )  # fmt: skip
                )
            else:
                gpus.append(GpuState(i, model, memory, memory))
            run_id += 1
        fleet.append(NodeState(f"n{n:04d}", tuple(gpus)))
    jobs = []
    for j in range(pending):
        common: dict[str, Any] = {
            "team": rng.choice(TEAMS),
            "user": f"u{rng.randrange(12)}",
            "submitted_at": float(rng.randrange(0, 86400)),
            "time_limit": 86400.0,
            "priority": rng.choice([0, 0, 0, 1, 1, 2, 3]),
            "gpu_model": "a100" if rng.random() < 0.15 else None,
        }
        if rng.random() < 0.2:
            # Fractions come in a few standard sizes, as users pick them from a menu.
            mem = rng.choice([4, 8, 10, 16, 20, 24, 40]) * 1024
            comp = rng.choice([10, 20, 25, 30, 50])
            jobs.append(
                PendingJob(j, gpus=0, gpu_memory_mb=mem, gpu_compute_percent=comp, **common)
            )
        else:
            jobs.append(PendingJob(j, gpus=rng.choice([1, 1, 1, 2, 2, 3, 4, 4, 6, 8]), **common))
    total = nodes * 8
    teams = {
        t: TeamState(t, hard_limit_gpus=int(total * 0.45), user_gpu_cap=int(total * 0.1))
        for t in TEAMS
    }
    return Snapshot(
        now=86400.0, nodes=tuple(fleet), running=tuple(running), pending=tuple(jobs), teams=teams
    )


def stranded_share(snapshot: Snapshot, plan) -> float:  # type: ignore[no-untyped-def]
    """Free GPU compute after the plan that no pending request shape could use, over all
    GPUs: on a partly used GPU, what no fraction shape fits; a wholly free GPU counts when
    no whole-GPU shape fits its node's wholly free GPUs (and no fraction fits it)."""
    free: dict[tuple[str, int], list[int]] = {}
    kinds: dict[tuple[str, int], tuple[str, int]] = {}
    for state in snapshot.nodes:
        for g in state.gpus:
            free[(state.name, g.index)] = [g.free_compute_percent, g.free_memory_mb, g.memory_mb]
            kinds[(state.name, g.index)] = (g.model, g.memory_mb)
    jobs = {j.id: j for j in snapshot.pending}
    for p in plan.places:
        job = jobs[p.job_id]
        for m in p.allocations:
            for i in m.gpu_indices:
                f = free[(m.node, i)]
                if job.gpus:
                    f[0], f[1] = 0, 0
                else:
                    f[0] -= job.gpu_compute_percent or 0
                    f[1] -= job.gpu_memory_mb or 0
    fracs = {(j.gpu_compute_percent or 0, j.gpu_memory_mb or 0, j.gpu_model)
             for j in snapshot.pending if j.is_fractional}  # fmt: skip
    wholes = {(j.gpus, j.gpu_model) for j in snapshot.pending if j.gpus}
    whole_on: dict[str, int] = {}
    for (node, _), f in free.items():
        if f[0] >= 100 and f[1] >= f[2]:
            whole_on[node] = whole_on.get(node, 0) + 1
    stranded = 0
    for (node, i), (comp, mem, total) in free.items():
        if comp <= 0 or mem <= 0:
            continue
        model = kinds[(node, i)][0]
        if (
            comp >= 100
            and mem >= total
            and any(k <= whole_on[node] and (m is None or m == model) for k, m in wholes)
        ):
            continue
        if any(comp >= q and mem >= mb and (m is None or m == model) for q, mb, m in fracs):
            continue
        stranded += comp
    return stranded / (100 * len(free))


def _value(plan, values) -> float:
    return sum(values[p.job_id] for p in plan.places)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run(pending: int, nodes: int, time_limit: float, seed: int, search: bool = True) -> None:
    snapshot = contended_fleet(pending, nodes, seed)
    values = job_values(snapshot, {})
    free = sum(g.is_whole_free for n in snapshot.nodes for g in n.gpus)
    demand = sum(j.gpu_equivalent for j in snapshot.pending)
    print(f"\n== {pending} pending on {nodes} nodes x 8 GPUs: {free} GPUs wholly free, "
          f"pending demand {demand:.0f} GPU equivalents ==")  # fmt: skip

    greedy, t_greedy = _timed(lambda: get_policy("greedy").schedule(snapshot))
    v_greedy = _value(greedy, values)
    print(
        f"greedy     {t_greedy * 1000:8.1f} ms  value {v_greedy:9.2f}  placed {len(greedy.places)}"
        f"  stranded {stranded_share(snapshot, greedy):.2%}"
    )

    policy = IlpPolicy(time_limit=time_limit)
    ilp, t_ilp = _timed(lambda: policy.schedule(snapshot))
    v_ilp = _value(ilp, values)
    last = policy.last
    fell = any("fell back" in n for n in ilp.notes)
    kept = any("kept greedy's plan" in n for n in ilp.notes)
    outcome = "fell back" if fell else "solved, kept greedy's plan" if kept else "solved"
    print(f"ilp        {t_ilp * 1000:8.1f} ms  value {v_ilp:9.2f}  placed {len(ilp.places)}"
          f"  stranded {stranded_share(snapshot, ilp):.2%}"
          f"  ilp/greedy {v_ilp / v_greedy if v_greedy else float('nan'):.4f}  {outcome}")  # fmt: skip
    for note in ilp.notes:
        print(f"           note: {note}")
    if last is not None:
        dual = last.dual_bound
        print(f"           model {last.n_vars} vars x {last.n_rows} rows, "
              f"{last.n_slot_classes} slot classes, {last.n_gpu_classes} GPU classes, "
              f"{last.bb_nodes} B&B nodes, status {last.status}, "
              f"solver objective {last.objective}, HiGHS dual bound "
              f"{'n/a' if dual is None else f'{dual:.2f}'}, mip_gap "
              f"{'n/a' if last.mip_gap is None else f'{last.mip_gap:.4%}'}")  # fmt: skip
        model = IlpPolicy.model_inputs(snapshot, values)
        model.pop("scorer")
        lp, t_lp = _timed(lambda: solve(**model, limits=Limits(time_limit=60.0), relax=True))
        if lp.objective is not None:
            gap = (lp.objective - v_ilp) / lp.objective if lp.objective else 0.0
            print(f"           LP relaxation of the model (its jobs, bounded candidates) {lp.objective:.2f} ({t_lp * 1000:.0f} ms); "
                  f"plan's gap to it {gap:.4%}; greedy's {(lp.objective - v_greedy) / lp.objective:.4%}")  # fmt: skip
        if dual is not None and dual > 0:
            print(f"           plan's gap to HiGHS dual bound {(dual - v_ilp) / dual:.4%}")

    for name in ("genetic", "annealing") if search else ():
        searcher: Any = get_policy(name, seed=seed)
        plan, t_search = _timed(lambda searcher=searcher: searcher.schedule(snapshot))
        v = _value(plan, values)
        print(f"{name:10} {t_search * 1000:8.1f} ms  value {v:9.2f}  placed {len(plan.places)}"
              f"  stranded {stranded_share(snapshot, plan):.2%}"
              f"  /greedy {v / v_greedy if v_greedy else float('nan'):.4f}"
              f"  evaluations {searcher.last_evaluations}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=0, help="nodes for every size")
    parser.add_argument("--no-search", action="store_true", help="skip genetic, annealing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", default="100,500,2000")
    args = parser.parse_args()
    print(f"ILP time limit {args.time_limit:g} s, seed {args.seed}")
    for pending in (int(s) for s in args.sizes.split(",")):
        nodes = args.nodes or SCALES.get(pending, max(8, pending // 16))
        run(pending, nodes, args.time_limit, args.seed, not args.no_search)


if __name__ == "__main__":
    main()
