"""Order search shared by `genetic` and `annealing`.

Both search over orders (permutations) of the most valuable pending jobs that could start
on their own, each order decoded by the greedy placer and scored as placed value minus a
fragmentation penalty (`Evaluator`). Bounds are counts (generations, iterations, jobs
considered), never clock time, so a plan is a function of the snapshot and the seed.
The best order found is booked; the jobs left out of the search then get best fit in
priority order. If that plan is worth less than plain greedy's, greedy's plan is kept.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from scheduler.core.model import Place, Plan, Snapshot
from scheduler.core.placement import FreeCapacity
from scheduler.core.quota import QuotaLedger
from scheduler.policies.packing._common import finish_plan
from scheduler.policies.packing._decode import Evaluator, place_in_order
from scheduler.policies.packing._values import greedy_order, job_values, setting, value_order

Perm = list[int]


class SearchPolicy:
    """Base of the order-search policies; subclasses set `name`, `_defaults` and `search`."""

    name = "search"
    _defaults: dict[str, Any] = {}

    def __init__(self, seed: int = 0, **params: Any) -> None:
        self.seed = seed
        prefix = f"{self.name}_"
        self.params = {(f"{prefix}{k}" if k in self._defaults else k): v for k, v in params.items()}
        # Evaluations used by the last schedule() call (for benchmarks and logs).
        self.last_evaluations = 0

    def setting(self, snapshot: Snapshot, key: str) -> Any:
        return setting(self.params, snapshot, f"{self.name}_{key}", self._defaults[key])

    def search(
        self, fitness: Callable[[Perm], float], size: int, rng: random.Random, snapshot: Snapshot
    ) -> Perm:
        raise NotImplementedError

    def schedule(self, snapshot: Snapshot) -> Plan:
        values = job_values(snapshot, self.params)
        queue = greedy_order(snapshot.pending)
        cap = FreeCapacity.from_snapshot(snapshot)
        ledger = QuotaLedger.from_snapshot(snapshot)
        placeable = [
            j
            for j in value_order(snapshot.pending, values)
            if ledger.check(j) is None and cap.best_fit_members(j) is not None
        ]
        limit = int(self.setting(snapshot, "max_jobs"))
        notes: list[str] = []
        if len(placeable) > limit:
            notes.append(
                f"{self.name}: searched orders of the {limit} most valuable of {len(placeable)} "
                "jobs that fit now; the rest get best fit after them, in priority order"
            )
        head = greedy_order(placeable[:limit])
        # The next jobs by value complete each trial plan, so that an order of the head is
        # judged by what it leaves for them; beyond those, jobs only get best fit at the end.
        tail = greedy_order(placeable[limit : 3 * limit])
        penalty = float(setting(self.params, snapshot, "fragmentation_penalty"))
        evaluator = Evaluator(head, values, cap, ledger, penalty, tail)
        rng = random.Random(self.seed)
        best = self.search(evaluator.fitness, len(head), rng, snapshot) if head else []
        self.last_evaluations = evaluator.evaluations

        places = place_in_order([head[i] for i in best], cap, ledger, f"{self.name} search")
        placed = {p.job_id for p in places}
        rest = [j for j in queue if j.id not in placed]
        places += place_in_order(rest, cap, ledger, "best fit")
        order = [head[i] for i in best]
        searched = {j.id for j in order}
        order += [j for j in queue if j.id not in searched]

        greedy_cap = FreeCapacity.from_snapshot(snapshot)
        greedy_ledger = QuotaLedger.from_snapshot(snapshot)
        greedy_places = place_in_order(queue, greedy_cap, greedy_ledger, "best fit")
        if _value(greedy_places, values) > _value(places, values) + 1e-9:
            notes.append(f"{self.name}: kept the greedy plan, worth more than the best order")
            return finish_plan(
                self.name, snapshot, greedy_cap, greedy_ledger, greedy_places, queue, notes
            )
        return finish_plan(self.name, snapshot, cap, ledger, places, order, notes)


def _value(places: list[Place], values: dict[int, float]) -> float:
    return sum(values[p.job_id] for p in places)


def order_crossover(a: Perm, b: Perm, rng: random.Random) -> Perm:
    """OX: a slice of `a` kept in place, the other positions filled in `b`'s order."""
    n = len(a)
    i, j = sorted(rng.sample(range(n), 2)) if n > 1 else (0, n)
    child: list[int | None] = [None] * n
    child[i:j] = a[i:j]
    kept = set(a[i:j])
    fill = iter(x for x in b if x not in kept)
    return [x if x is not None else next(fill) for x in child]


def mutate(perm: Perm, rng: random.Random) -> Perm:
    """A swap of two jobs, or one job moved to another place in the order."""
    out = list(perm)
    if len(out) < 2:
        return out
    i, j = rng.sample(range(len(out)), 2)
    if rng.random() < 0.5:
        out[i], out[j] = out[j], out[i]
    else:
        out.insert(j, out.pop(i))
    return out


def seeded_population(size: int, count: int, rng: random.Random) -> list[Perm]:
    """Greedy's order, perturbations of it (a few moves each) and a few random orders."""
    identity = list(range(size))
    population = [identity]
    while len(population) < count:
        if len(population) % 4 == 3:
            perm = list(identity)
            rng.shuffle(perm)
        else:
            perm = identity
            for _ in range(1 + rng.randrange(max(1, size // 4))):
                perm = mutate(perm, rng)
        population.append(perm)
    return population[:count]
