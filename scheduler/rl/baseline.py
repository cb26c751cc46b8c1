"""rl-cem: a linear scorer over the queue head, its weights found by the cross-entropy method
in the Gymnasium environment (see scheduler/rl/train.py).

Each cycle it repeatedly scores the first K pending jobs that fit now,
score = w . (log1p(expected runtime), log1p(wait), gpus / node size), and starts the best by
best fit, until nothing in the head fits. It sees what a production policy sees (time limits
and predictions, never true runtimes) and never preempts. It is a reference driver in the
simulator's own list, not a production policy.
"""

from __future__ import annotations

import math

from scheduler.rl.features import best_fit, expected_runtime, queue_head
from scheduler.sim.state import SimState

# From `python -m scheduler.rl.train` with its defaults (8 iterations of 12 candidates, 2
# episodes of 500 synthetic Philly-like jobs on 2x8 GPUs at load 1.0, seed 0): it learns
# shortest-expected-first, with a slight lean to large gangs and against long waiters.
DEFAULT_WEIGHTS = (-1.467, -0.158, 0.167)


def score(weights: tuple[float, ...], expected: float, wait: float, gpu_share: float) -> float:
    return (
        weights[0] * math.log1p(expected)
        + weights[1] * math.log1p(max(0.0, wait))
        + weights[2] * gpu_share
    )


def choose(state: SimState, head: list[int], weights: tuple[float, ...]) -> int | None:
    """Position in `head` of the best-scoring job that fits now, or None."""
    best, best_score = None, -math.inf
    max_node = state.cluster.max_node_gpus
    for pos, job_id in enumerate(head):
        spec = state.jobs[job_id].spec
        if best_fit(state, spec) is None:
            continue
        s = score(
            weights,
            expected_runtime(state, job_id),
            state.now - spec.submit,
            (spec.gpus or 1) / max_node,
        )
        if s > best_score:
            best, best_score = pos, s
    return best


class CemDriver:
    name = "rl-cem"

    def __init__(self, weights: tuple[float, ...] = DEFAULT_WEIGHTS, k: int = 16) -> None:
        self.weights = tuple(weights)
        self.k = k

    def cycle(self, state: SimState) -> int:
        started = 0
        while state.pending and sum(state.free_whole.values()):
            head = queue_head(state, self.k)
            pos = choose(state, head, self.weights)
            if pos is None:
                break
            spec = state.jobs[head[pos]].spec
            choice = best_fit(state, spec)
            if choice is None or state.start(spec.id, *choice):
                break
            started += 1
        return started
