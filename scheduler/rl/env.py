"""A Gymnasium environment over the simulator (needs the `rl` extra: gymnasium).

- Observation: the first K pending jobs in submit order (present, GPUs / node size, log
  expected runtime, log wait, fits now), then free capacity (free share, largest free block,
  nodes by free-GPU count); see scheduler.rl.features.observe.
- Action: Discrete(K + 1). 0..K-1 starts that queue-head job by best fit; K waits until the
  next arrival or completion. Choosing a job that does not fit (or an empty slot) waits too.
- Reward: minus the slowdown accrued while time advances: each second, every job in the
  system adds 1 / max(runtime, 10 s), so an episode's return is minus the total bounded
  slowdown. The reward uses true runtimes (the simulator knows them); the observation does not.
  Waiting when no arrival or completion is left truncates the episode.
- Episodes: one job list from start to finish. With `jobs=None` each reset generates a new
  Philly-like list from the reset seed.

Example (also in scheduler/sim/README.md):

    from scheduler.rl.env import SchedulingEnv
    env = SchedulingEnv(n_jobs=200, cluster="2x8xV100", load=0.9)
    obs, info = env.reset(seed=0)
    done = False
    while not done:
        obs, reward, done, truncated, info = env.step(env.action_space.sample())
    print(info["metrics"]["jct_avg"])
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from scheduler.rl.features import best_fit, obs_size, observe, queue_head
from scheduler.sim.cluster import parse_cluster
from scheduler.sim.engine import SimResult
from scheduler.sim.jobs import JobSpec
from scheduler.sim.metrics import SLOWDOWN_FLOOR_S, compute_metrics
from scheduler.sim.predict import make_predictor
from scheduler.sim.sources import synthetic
from scheduler.sim.state import SimConfig, SimState
from scheduler.sim.transform import prepare


class SchedulingEnv(gym.Env):
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        jobs: list[JobSpec] | None = None,
        *,
        cluster: str = "2x8xV100",
        k: int = 16,
        n_jobs: int = 200,
        load: float = 0.9,
        config: SimConfig | None = None,
        predict: bool = True,
    ) -> None:
        self.cluster = parse_cluster(cluster)
        self.k = k
        self.n_jobs = n_jobs
        self.load = load
        self.config = config or SimConfig()
        self.predict = predict
        self._fixed = jobs
        self.action_space = gym.spaces.Discrete(k + 1)
        size = obs_size(k, self.cluster.max_node_gpus)
        self.observation_space = gym.spaces.Box(0.0, np.inf, shape=(size,), dtype=np.float32)
        self.state: SimState | None = None

    def _jobs(self, seed: int) -> list[JobSpec]:
        if self._fixed is not None:
            return self._fixed
        g = self.cluster.total_gpus
        raw = synthetic(
            self.n_jobs,
            total_gpus=g,
            load=self.load,
            seed=seed,
            max_gpus=self.cluster.max_node_gpus,
        )
        return prepare(raw, total_gpus=g, max_node_gpus=self.cluster.max_node_gpus, seed=seed)[0]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        job_seed = int(self.np_random.integers(2**31)) if seed is None else seed
        self.state = SimState(self._jobs(job_seed), self.cluster, self.config)
        if self.predict:
            self.state.predictor = make_predictor()
        self._head: list[int] = []
        self._advance()
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        assert self.state is not None
        self._head = queue_head(self.state, self.k)
        shape = self.observation_space.shape
        assert shape is not None
        obs = np.zeros(shape, dtype=np.float32)
        vec = observe(self.state, self._head)
        rows = len(self._head) * 5
        obs[:rows] = vec[:rows]
        obs[self.k * 5 :] = vec[rows:]
        return obs

    def _can_act(self) -> bool:
        s = self.state
        assert s is not None
        return any(best_fit(s, s.jobs[j].spec) for j in queue_head(s, self.k))

    def _advance(self) -> float:
        """Move time until the agent has a choice (or the episode ends); the slowdown accrued."""
        s = self.state
        assert s is not None
        reward = 0.0
        first = True
        while first or not self._can_act():
            first = False
            t = s.next_event_time()
            if t == math.inf:
                break
            weight = sum(
                1.0 / max(s.jobs[j].spec.work, SLOWDOWN_FLOOR_S)
                for ids in (s.pending, s.running)
                for j in ids
            )
            reward -= weight * (t - s.now)
            s.advance(t)
        return reward

    def _done(self) -> bool:
        s = self.state
        assert s is not None
        return not s.pending and not s.running and s.arrivals_left == 0

    def step(self, action: int):
        s = self.state
        assert s is not None, "call reset() first"
        reward = 0.0
        placed = False
        if 0 <= action < len(self._head):
            spec = s.jobs[self._head[action]].spec
            choice = best_fit(s, spec)
            if choice is not None:
                placed = s.start(spec.id, *choice) is None
        stalled = not placed and s.next_event_time() == math.inf
        if not placed or not self._can_act():
            reward += self._advance()
        done = self._done()
        # Waiting with nothing left to happen would never end: the episode is cut short.
        truncated = stalled and not done
        info: dict[str, Any] = {"placed": placed, "now": s.now}
        if done:
            result = SimResult(policy="rl-env", state=s, wall_seconds=0.0, cycles=0)
            info["metrics"] = compute_metrics(result)
        return self._obs(), reward, done, truncated, info
