"""`annealing`: simulated annealing over job orders, each decoded by the greedy placer.

Starts from greedy's order; a move swaps two jobs or moves one; a worse order is accepted
with probability exp(delta / T), T cooling geometrically from `annealing_t0` times the mean
job value to 1 % of that over `annealing_iterations` moves. The best order seen is kept,
and greedy's plan is kept if it is worth more. Deterministic for a seed.

Settings (snapshot.settings, or constructor keywords with or without the `annealing_`
prefix): `annealing_iterations` (300), `annealing_t0` (0.5), `annealing_max_jobs` (40),
plus `fragmentation_penalty` and the value weights of `_values`.

A teaching baseline, not a production policy: on bench/bench_packing.py (1,200 nodes,
requests arriving in cycles) it placed what greedy placed and stranded the same share
within noise, at about 9-19 times greedy's CPU per cycle (docs/packing.md).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from scheduler.core.model import Snapshot
from scheduler.policies.packing._search import Perm, SearchPolicy, mutate
from scheduler.policies.packing._values import job_values


class AnnealingPolicy(SearchPolicy):
    name = "annealing"
    _defaults = {"iterations": 300, "t0": 0.5, "max_jobs": 40}

    def search(
        self, fitness: Callable[[Perm], float], size: int, rng: random.Random, snapshot: Snapshot
    ) -> Perm:
        iterations = int(self.setting(snapshot, "iterations"))
        values = list(job_values(snapshot, self.params).values())
        scale = sum(values) / len(values) if values else 1.0
        t_start = max(1e-6, float(self.setting(snapshot, "t0")) * scale)
        t_end = t_start * 0.01
        cooling = (t_end / t_start) ** (1.0 / max(1, iterations))

        current = list(range(size))
        current_score = fitness(current)
        best, best_score = current, current_score
        temperature = t_start
        for _ in range(iterations if size > 1 else 0):
            candidate = mutate(current, rng)
            score = fitness(candidate)
            delta = score - current_score
            if delta >= 0 or rng.random() < math.exp(delta / temperature):
                current, current_score = candidate, score
                if score > best_score + 1e-9:
                    best, best_score = candidate, score
            temperature *= cooling
        return best
