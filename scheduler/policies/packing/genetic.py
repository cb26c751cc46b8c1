"""`genetic`: a genetic algorithm over job orders, each decoded by the greedy placer.

Permutation encoding; the first population holds greedy's own order, so the result is
never worse than greedy's (kept if worth more). Tournament selection, order crossover,
swap/move mutation and elitism; stops after `genetic_generations` generations or
`genetic_patience` generations without improvement. Deterministic for a given `seed`.

Settings (snapshot.settings, or constructor keywords with or without the `genetic_`
prefix): `genetic_population` (20), `genetic_generations` (25), `genetic_patience` (8),
`genetic_mutation` (0.3), `genetic_max_jobs` (40: only the most valuable jobs that fit
now are searched), plus `fragmentation_penalty` and the value weights of `_values`.

A teaching baseline, not a production policy: on bench/bench_packing.py (1,200 nodes,
requests arriving in cycles) it placed what greedy placed and stranded the same share
within noise, at about 9-19 times greedy's CPU per cycle (docs/packing.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from scheduler.core.model import Snapshot
from scheduler.policies.packing._search import (
    Perm,
    SearchPolicy,
    mutate,
    order_crossover,
    seeded_population,
)


class GeneticPolicy(SearchPolicy):
    name = "genetic"
    _defaults = {
        "population": 20,
        "generations": 25,
        "patience": 8,
        "mutation": 0.3,
        "max_jobs": 40,
    }

    def search(
        self, fitness: Callable[[Perm], float], size: int, rng: random.Random, snapshot: Snapshot
    ) -> Perm:
        pop_size = max(2, int(self.setting(snapshot, "population")))
        generations = int(self.setting(snapshot, "generations"))
        patience = int(self.setting(snapshot, "patience"))
        mutation = float(self.setting(snapshot, "mutation"))
        elite = max(1, pop_size // 10)

        population = seeded_population(size, pop_size, rng)
        scored = sorted(((fitness(p), -i, p) for i, p in enumerate(population)), reverse=True)
        best_score, _, best = scored[0]
        stale = 0
        for _ in range(generations):
            if stale >= patience or size < 2:
                break
            children = [p for _, _, p in scored[:elite]]
            while len(children) < pop_size:
                a = _tournament(scored, rng)
                b = _tournament(scored, rng)
                child = order_crossover(a, b, rng)
                if rng.random() < mutation:
                    child = mutate(child, rng)
                children.append(child)
            scored = sorted(((fitness(p), -i, p) for i, p in enumerate(children)), reverse=True)
            if scored[0][0] > best_score + 1e-9:
                best_score, _, best = scored[0]
                stale = 0
            else:
                stale += 1
        return best


def _tournament(scored: list[tuple[float, int, Perm]], rng: random.Random, k: int = 3) -> Perm:
    picks = [scored[rng.randrange(len(scored))] for _ in range(k)]
    return max(picks, key=lambda item: (item[0], item[1]))[2]
