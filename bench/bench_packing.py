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
    if args.policies or args.cycle:
        from bench_packing_cycles import cycle_cost, policy_rows

        if args.policies:
            policy_rows(args)
        else:
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

    def rest(r: list[Row]) -> str:
        ratio = [x[1] / b[1] if b[1] else float("nan") for x, b in zip(r, base, strict=True)]
        return (
            f" {_ms(ratio, 2):>12}"
            f" {statistics.mean(x[2] for x in r):8.0f} {statistics.mean(x[3] for x in r):7.0f}"
            f" {statistics.mean(x[4] for x in r):7.0f} {statistics.mean(x[5] for x in r):6.2f}"
        )

    print_rows(
        ("placement", 14),
        f" {'x first-fit':>12} {'slivers':>8} {'shared':>7} {'placed':>7} {'s/run':>6}",
        {name: (rows[name], rest(rows[name])) for name in names},
    )
    print("mean ± standard deviation over seeds; x first-fit: per-seed ratio of stranded shares")


# (allocated, stranded, slivers, shared GPUs, requests placed, seconds) of one run.
Row = tuple[float, float, int, int, int, float]


def print_rows(
    first: tuple[str, int], header: str, lines: dict[str, tuple[list[Row], str]]
) -> None:
    """A blank line, a header, then one line per label: allocated and stranded shares over
    seeds (mean ± standard deviation, in %), then the label's own further cells."""
    title, width = first
    print()
    print(f"{title:<{width}} {'allocated %':>14} {'stranded %':>14}{header}")
    for label, (r, rest) in lines.items():
        alloc = [x[0] * 100 for x in r]
        strand = [x[1] * 100 for x in r]
        print(f"{label:<{width}} {_ms(alloc):>14} {_ms(strand):>14}{rest}")


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


Sampler = Callable[[], PendingJob]

if __name__ == "__main__":
    main()
