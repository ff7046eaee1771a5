"""An env whose constructor arguments show in what it returns, for tests/test_env_kwargs.py.

Used as `kwargs_envs:KwargsEcho-v0` with tests/ on PYTHONPATH (Ray actors get the driver's PYTHONPATH).
Every episode is EPISODE_STEPS steps of reward `bonus`, so its return is EPISODE_STEPS * bonus exactly;
observations have `size` elements, so a network built for another size cannot act on them.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

EPISODE_STEPS = 10


class KwargsEcho(gym.Env):
    def __init__(self, bonus: float = 1.0, size: int = 3, render_mode: str | None = None):
        self.bonus, self.size, self.render_mode = float(bonus), int(size), render_mode
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.size,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self) -> np.ndarray:
        return np.full(self.size, self.bonus, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), self.bonus, False, False, {}


if "KwargsEcho-v0" not in gym.registry:
    gym.register("KwargsEcho-v0", entry_point=KwargsEcho, max_episode_steps=EPISODE_STEPS)
