"""Packing: how much GPU capacity each placement strands on a production-shaped fleet.

A seeded synthetic fleet and request mix; requests are placed one by one in arrival order
until the first one that cannot be placed anywhere (that request is the "first refusal").
At that point the bench prints, per placement:

- allocated share: GPU compute booked (fractions count their compute share) / all GPUs;
- stranded share: free GPU compute that no request shape of the mix could use / all GPUs.
  A free share on a GPU is usable when some fraction shape of the mix fits on that GPU
  (its model and memory allowed, compute percent <= free compute, GPU memory <= free
  memory), or, for a wholly free GPU, when some whole-GPU shape of the mix fits on its node
  (enough wholly free GPUs of an allowed kind). Everything else free is stranded;
- the ratio of both to first-fit's in the same run.

Placements: naive first-fit (nodes and GPUs in fixed order, the first that fits) and
naive best-fit (the node with the fewest wholly free GPUs that hold a gang; for a fraction
the GPU with the least compute left after it, then the least memory), both written here
over numpy arrays; fleet's placement as it was (FreeCapacity without a demand, plain best
fit); and fleet's fragmentation-aware placement (scheduler.core.fragmentation), given the
mix's distribution as its demand ("frag-mix") or the mix read off 2,000 earlier requests
of the same generator with another seed ("frag-hist", what production learns from its
queue).

Fleet (per seed): 1,200 nodes; GPUs per node 2 (20 %), 4 (30 %), 8 (50 %); one GPU model
per node: A100-80GB 35 %, A100-40GB 25 %, H100-80GB 15 %, V100-32GB 15 %, T4-16GB 10 %
(about 6,700 GPUs). Requests: 55 % a fraction of one GPU, 30 % one whole GPU, 7 % two,
5 % four, 3 % eight (all on one node). A fraction's compute percent is drawn from
10/20/25/30/40/50/75 (weights 15/20/20/10/10/15/10) and its GPU memory is that share of
16, 32 or 80 GB (weights 40/40/20), rounded to 1 GB. 10 % of fractions and of 1-GPU
requests name a GPU model (drawn by the fleet's shares, redrawn until it can hold them).

Packing policies in cycles (`--policies greedy,ilp,genetic,annealing`): requests arrive
`--batch` at a time; each cycle the policy plans for every request still waiting on a
snapshot of what is free (fleet's default fragmentation-aware placement), its places are
booked, and the run stops after the first cycle that leaves a request waiting (the cycle's
"first refusal"). Rows "<policy>/cycle" give the same measures, plus per policy: cycles,
cycles where the ILP solved (not fell back), and CPU seconds per cycle.

    .venv/bin/python bench/bench_packing.py [--seeds 5] [--nodes 1200]
        [--policies greedy,ilp] [--policy-seeds 2] [--batch 200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler.core.fragmentation import (  # noqa: E402
    Demand,
    demand_from_jobs,
    normalize,
    shape_of,
)
from scheduler.core.model import GpuState, NodeState, PendingJob  # noqa: E402
from scheduler.core.placement import FreeCapacity  # noqa: E402

GB = 1024
MODELS = (
    ("A100", 80 * GB, 0.35),
    ("A100", 40 * GB, 0.25),
    ("H100", 80 * GB, 0.15),
    ("V100", 32 * GB, 0.15),
    ("T4", 16 * GB, 0.10),
)
PER_NODE = ((2, 0.2), (4, 0.3), (8, 0.5))
SIZES = ((0, 0.55), (1, 0.30), (2, 0.07), (4, 0.05), (8, 0.03))
COMPUTE = ((30, 20), (40, 20), (50, 15), (60, 15), (70, 15), (80, 15))
MEMORY = ((10 * GB, 20), (16 * GB, 20), (20 * GB, 20), (24 * GB, 15), (30 * GB, 15), (48 * GB, 10))
NAMED = 0.0  # --named: share of fractions and 1-GPU requests that name a model


def _pick(rng: random.Random, table):  # type: ignore[no-untyped-def]
    values, weights = zip(*table, strict=True)
    return rng.choices(values, weights)[0]


def build_fleet(nodes: int, seed: int) -> tuple[NodeState, ...]:
    rng = random.Random(seed)
    out = []
    for n in range(nodes):
        model, mem, _ = rng.choices(MODELS, [m[2] for m in MODELS])[0]
        count = _pick(rng, PER_NODE)
        gpus = tuple(GpuState(i, model, mem, mem) for i in range(count))
        out.append(NodeState(f"n{n:04d}", gpus))
    return tuple(out)


def requests(
    count: int, seed: int, fleet: tuple[NodeState, ...], named: float = NAMED
) -> list[PendingJob]:
    rng = random.Random(seed * 7919 + 1)
    kinds = sorted({(g.model, g.memory_mb) for n in fleet for g in n.gpus})
    out = []
    for i in range(count):
        size = _pick(rng, SIZES)
        model = None
        if size == 0:
            comp = _pick(rng, COMPUTE)
            mem = _pick(rng, MEMORY)
            if rng.random() < named:
                while True:
                    model, kmem, _ = rng.choices(MODELS, [m[2] for m in MODELS])[0]
                    if kmem >= mem:
                        break
            job = PendingJob(
                i, "t", "u", float(i), 3600.0, 0, mem, comp, model, None, 0, "normal", True
            )
        else:
            if size == 1 and rng.random() < named:
                model = rng.choices(MODELS, [m[2] for m in MODELS])[0][0]
            job = PendingJob(i, "t", "u", float(i), 3600.0, size, gpu_model=model)
        out.append(job)
    assert kinds
    return out


# -- naive placements over arrays --------------------------------------------------------


class Arrays:
    """Per-GPU free compute and memory, per-node wholly free counts."""

    def __init__(self, fleet: tuple[NodeState, ...]) -> None:
        self.models = [g.model for n in fleet for g in n.gpus]
        self.total_mem = np.array([g.memory_mb for n in fleet for g in n.gpus])
        self.node_of = np.array([i for i, n in enumerate(fleet) for _ in n.gpus])
        self.comp = np.full(len(self.models), 100)
        self.mem = self.total_mem.copy()
        self.node_model = [n.gpus[0].model for n in fleet]
        self.node_mem = np.array([n.gpus[0].memory_mb for n in fleet])
        self.first_gpu = np.array([0, *np.cumsum([len(n.gpus) for n in fleet])[:-1]])
        self.whole = np.array([len(n.gpus) for n in fleet])
        self.model_mask = {m: np.array([x == m for x in self.models]) for m in set(self.models)}
        self.node_model_mask = {
            m: np.array([x == m for x in self.node_model]) for m in set(self.node_model)
        }

    def place(self, job: PendingJob, best: bool) -> bool:
        if job.gpus:
            ok = self.whole >= job.gpus
            if job.gpu_model is not None:
                ok &= self.node_model_mask.get(job.gpu_model, False)
            cands = np.flatnonzero(ok)
            if not len(cands):
                return False
            node = cands[np.argmin(self.whole[cands])] if best else cands[0]
            start = self.first_gpu[node]
            taken = 0
            g = start
            while taken < job.gpus:
                if self.comp[g] == 100 and self.mem[g] == self.total_mem[g]:
                    self.comp[g], self.mem[g] = 0, 0
                    taken += 1
                g += 1
            self.whole[node] -= job.gpus
            return True
        q, m = job.gpu_compute_percent or 0, job.gpu_memory_mb or 0
        ok = (self.comp >= q) & (self.mem >= m) & (self.comp > 0) & (self.mem > 0)
        if job.gpu_model is not None:
            ok &= self.model_mask.get(job.gpu_model, False)
        cands = np.flatnonzero(ok)
        if not len(cands):
            return False
        if best:
            key = (self.comp[cands] - q) * 10_000_000 + (self.mem[cands] - m)
            g = cands[np.argmin(key)]
        else:
            g = cands[0]
        if self.comp[g] == 100 and self.mem[g] == self.total_mem[g]:
            self.whole[self.node_of[g]] -= 1
        self.comp[g] -= q
        self.mem[g] -= m
        return True

    def state(self) -> list[tuple[str, int, int, int, int, int]]:
        """(model, total MB, free %, free MB, node, wholly free on node) per GPU."""
        return [
            (
                self.models[g],
                int(self.total_mem[g]),
                int(self.comp[g]),
                int(self.mem[g]),
                int(self.node_of[g]),
                int(self.whole[self.node_of[g]]),
            )
            for g in range(len(self.models))
        ]


def fleet_state(cap: FreeCapacity, fleet: tuple[NodeState, ...]):  # type: ignore[no-untyped-def]
    out = []
    for i, n in enumerate(fleet):
        whole = len(cap.whole_free(n.name))
        for g in n.gpus:
            mem, comp = cap.free_on(n.name, g.index)
            out.append((g.model, g.memory_mb, comp, mem, i, whole))
    return out


# -- measures ----------------------------------------------------------------------------


def measure(state, mix: list[PendingJob]) -> tuple[float, float, int, int]:  # type: ignore[no-untyped-def]
    """(allocated share, stranded share, GPUs with a stranded sliver, GPUs shared by
    fractions)."""
    fracs = {(j.gpu_compute_percent, j.gpu_memory_mb, j.gpu_model) for j in mix if not j.gpus}
    wholes = {(j.gpus, j.gpu_model) for j in mix if j.gpus}
    total = 100 * len(state)
    free = stranded = 0
    slivers = shared = 0
    for model, tmem, comp, mem, _, whole in state:
        if 0 < comp < 100 or 0 < mem < tmem:
            shared += 1
        if comp <= 0 or mem <= 0:
            continue
        free += comp
        if comp >= 100 and mem >= tmem:
            if any(k <= whole and (m is None or m == model) for k, m in wholes):
                continue
        if any(
            comp >= q and mem >= mm and (m is None or m == model) and mm <= tmem
            for q, mm, m in fracs
        ):
            continue
        stranded += comp
        slivers += 1
    return (total - free) / total, stranded / total, slivers, shared


def run_one(
    name: str, fleet: tuple[NodeState, ...], mix: list[PendingJob], demand: Demand | None
) -> tuple[float, float, int, int, int, float]:
    """(allocated, stranded, slivers, shared GPUs, requests placed, seconds)."""
    t0 = time.perf_counter()
    placed = 0
    if name in ("first-fit", "best-fit"):
        arrays = Arrays(fleet)
        for job in mix:
            if not arrays.place(job, best=name == "best-fit"):
                break
            placed += 1
        state = arrays.state()
    else:
        cap = FreeCapacity(fleet, demand)
        for job in mix:
            choice = cap.best_fit(job)
            if choice is None:
                break
            cap.take(job, *choice)
            placed += 1
        state = fleet_state(cap, fleet)
    seconds = time.perf_counter() - t0
    allocated, stranded, slivers, shared = measure(state, mix)
    return allocated, stranded, slivers, shared, placed, seconds


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
) -> tuple[tuple[float, float, int, int, int, float], int, int, int, float]:
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
    rows: dict[str, list[tuple[float, float, int, int, int, float]]] = {n: [] for n in names}
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
    print()
    print(
        f"{'policy':<16} {'allocated %':>14} {'stranded %':>14} {'slivers':>8} {'placed':>7}"
        f" {'cycles':>7} {'ilp solved':>10} {'kept greedy':>11} {'CPU s/cycle':>12}"
    )
    for name in names:
        r = rows[name]
        alloc = [x[0] * 100 for x in r]
        strand = [x[1] * 100 for x in r]
        cycles = sum(e[0] for e in extra[name])
        solved = sum(e[1] for e in extra[name])
        kept = sum(e[2] for e in extra[name])
        ilp = name == "ilp"
        print(
            f"{name + '/cycle':<16} {_ms(alloc):>14} {_ms(strand):>14}"
            f" {statistics.mean(x[2] for x in r):8.0f} {statistics.mean(x[4] for x in r):7.0f}"
            f" {cycles:7d} {(str(solved) if ilp else '-'):>10} {(str(kept) if ilp else '-'):>11}"
            f" {statistics.mean(e[3] for e in extra[name]):12.2f}"
        )
    print(
        "mean ± standard deviation over seeds; ilp solved: cycles the solver returned a plan"
        " (optimal, or the best found at a work limit), no fallback; kept greedy: cycles"
        " where greedy's plan scored higher on the solver's objective and was kept (noted)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=1200)
    parser.add_argument("--named", type=float, default=NAMED)
    parser.add_argument(
        "--cycle", default="", help="also time these policies' cycles, e.g. fcfs,priority"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--policies", default="", help="packing policies run in cycles")
    parser.add_argument("--policy-seeds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()
    if args.policies:
        policy_rows(args)
        return
    if args.cycle:
        cycle_cost(args.cycle.split(","), args.repeat)
        return
    names = ("first-fit", "best-fit", "fleet-bestfit", "frag-mix", "frag-hist")
    rows: dict[str, list[tuple[float, float, int, int, int, float]]] = {n: [] for n in names}
    for seed in range(1, args.seeds + 1):
        fleet = build_fleet(args.nodes, seed)
        gpus = sum(len(n.gpus) for n in fleet)
        mix = requests(4 * gpus, seed, fleet, args.named)
        true_mix = _true_demand(fleet, args.named)
        history = demand_from_jobs(requests(2000, seed + 1000, fleet, args.named), sample=2000)
        demands: dict[str, Demand | None] = {
            "fleet-bestfit": None,
            "frag-mix": true_mix,
            "frag-hist": history,
        }
        line = [f"seed {seed}: {len(fleet)} nodes, {gpus} GPUs"]
        for name in names:
            row = run_one(name, fleet, mix, demands.get(name))
            rows[name].append(row)
            line.append(f"{name} {row[1] * 100:.2f}%")
        print("; ".join(line), flush=True)
    base = rows["first-fit"]
    print()
    print(
        f"{'placement':<14} {'allocated %':>14} {'stranded %':>14} {'x first-fit':>12}"
        f" {'slivers':>8} {'shared':>7} {'placed':>7} {'s/run':>6}"
    )
    for name in names:
        r = rows[name]
        alloc = [x[0] * 100 for x in r]
        strand = [x[1] * 100 for x in r]
        ratio = [x[1] / b[1] if b[1] else float("nan") for x, b in zip(r, base, strict=True)]
        print(
            f"{name:<14} {_ms(alloc):>14} {_ms(strand):>14} {_ms(ratio, 2):>12}"
            f" {statistics.mean(x[2] for x in r):8.0f} {statistics.mean(x[3] for x in r):7.0f}"
            f" {statistics.mean(x[4] for x in r):7.0f} {statistics.mean(x[5] for x in r):6.2f}"
        )
    print("mean ± standard deviation over seeds; x first-fit: per-seed ratio of stranded shares")


def _ms(values: list[float], digits: int = 2) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f}"


def _true_demand(fleet: tuple[NodeState, ...], named: float) -> Demand:
    """The generator's distribution, as the scorer's demand (from a large sample)."""
    jobs = requests(20_000, 424242, fleet, named)
    counts: dict = {}
    for j in jobs:
        s = shape_of(j)
        counts[s] = counts.get(s, 0) + 1
    return normalize(counts.items())


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


Sampler = Callable[[], PendingJob]

if __name__ == "__main__":
    main()
