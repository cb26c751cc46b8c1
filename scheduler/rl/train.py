"""Train the rl-cem baseline: the cross-entropy method over the linear scorer's weights,
each candidate scored by the return of whole episodes in SchedulingEnv.

    python -m scheduler.rl.train --iterations 8 --population 12 --episodes 2 --seed 0 \
        --jobs 500 --load 1.0

Prints the best weights; paste them into scheduler/rl/baseline.py DEFAULT_WEIGHTS.
"""

from __future__ import annotations

import argparse

import numpy as np

from scheduler.rl.baseline import choose
from scheduler.rl.env import SchedulingEnv


def episode_return(env: SchedulingEnv, weights: tuple[float, ...], seed: int) -> float:
    env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        assert env.state is not None
        pos = choose(env.state, env._head, weights)
        action = env.k if pos is None else pos
        _, reward, done, _, _ = env.step(action)
        total += reward
    return total


def train(iterations: int, population: int, episodes: int, seed: int, **env_kw) -> np.ndarray:
    rng = np.random.default_rng(seed)
    env = SchedulingEnv(**env_kw)
    mean, std = np.array([-1.0, 0.0, 0.0]), np.array([0.7, 0.7, 0.7])
    elite = max(2, population // 4)
    for it in range(iterations):
        cands = mean + std * rng.standard_normal((population, 3))
        scores = np.array(
            [
                np.mean([episode_return(env, tuple(c), seed * 1000 + e) for e in range(episodes)])
                for c in cands
            ]
        )
        best = cands[np.argsort(scores)[-elite:]]
        mean, std = best.mean(axis=0), best.std(axis=0) + 0.05
        print(f"iteration {it}: best return {scores.max():.1f}, mean weights {np.round(mean, 3)}")
    return mean


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--population", type=int, default=12)
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--cluster", default="2x8xV100")
    p.add_argument("--load", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    w = train(
        a.iterations,
        a.population,
        a.episodes,
        a.seed,
        n_jobs=a.jobs,
        cluster=a.cluster,
        load=a.load,
    )
    print("weights:", tuple(round(float(x), 3) for x in w))


if __name__ == "__main__":
    main()
