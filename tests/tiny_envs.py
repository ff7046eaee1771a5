"""Tiny user envs that a policy solves exactly in a few updates, for tests/test_env_stages.py.

Used as `tiny_envs:Corridor-v0` and `tiny_envs:Bandit-v0` with tests/ on PYTHONPATH. Both declare a time limit
(gymnasium's make wraps them in a TimeLimit), and the corridor also truncates for its own reason (stepping off
its left end), which a check of the time limit must not count against it.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

CORRIDOR_CELLS = 4
CORRIDOR_LIMIT = 8


class Corridor(gym.Env):
    """Start at cell 0; action 1 steps right, 0 left. Reaching the last cell: reward 1, terminated. Stepping left
    from cell 0: truncated (the env's own reason), reward 0. Best return 1, in CORRIDOR_CELLS - 1 steps."""

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (CORRIDOR_CELLS,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.cell = 0

    def _obs(self) -> np.ndarray:
        return np.eye(CORRIDOR_CELLS, dtype=np.float32)[self.cell]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = 0
        return self._obs(), {}

    def step(self, action):
        if int(action) == 0 and self.cell == 0:
            return self._obs(), 0.0, False, True, {}
        self.cell += 1 if int(action) == 1 else -1
        done = self.cell == CORRIDOR_CELLS - 1
        return self._obs(), float(done), done, False, {}


class Bandit(gym.Env):
    """One step per episode: arm 1 pays 1, arm 0 pays 0; the declared limit of 1 step truncates it as it ends."""

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.ones(1, np.float32), {}

    def step(self, action):
        return np.ones(1, np.float32), float(int(action) == 1), True, False, {}


for _name, _entry, _limit in (("Corridor-v0", Corridor, CORRIDOR_LIMIT), ("Bandit-v0", Bandit, 1)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=_entry, max_episode_steps=_limit)
