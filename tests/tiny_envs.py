"""Tiny user envs for tests/test_env_stages.py: some a policy solves exactly in a few updates, some whose reset
must restore state the env keeps.

Used as `tiny_envs:Corridor-v0` and `tiny_envs:Bandit-v0` with tests/ on PYTHONPATH. Both declare a time limit
(gymnasium's make wraps them in a TimeLimit), and the corridor also truncates for its own reason (stepping off
its left end), which a check of the time limit must not count against it. `SelfLimitedCartPole-v0` keeps its
own time limit (no TimeLimit), `Orchard-v0` keeps fruit that its reset puts back, and `NoisyBandit-v0` is
stochastic whatever its seed (tests/planted_env_stages.py breaks the first two's resets).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

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


class OffsetCorridor(gym.Env):
    """The corridor with gymnasium's offset Discrete spaces: cells are observations START..START+CELLS-1 and the
    actions are 1 (left) and 2 (right); an action outside the space raises, as a strict user env would."""

    START = 10

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Discrete(CORRIDOR_CELLS, start=self.START)
        self.action_space = gym.spaces.Discrete(2, start=1)
        self.cell = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = 0
        return self.START, {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is outside {self.action_space}")
        self.cell = max(0, self.cell + (1 if int(action) == 2 else -1))
        done = self.cell == CORRIDOR_CELLS - 1
        return self.START + self.cell, float(done), done, False, {}


for _name, _entry, _limit in (("Corridor-v0", Corridor, CORRIDOR_LIMIT), ("Bandit-v0", Bandit, 1),
                              ("OffsetCorridor-v0", OffsetCorridor, CORRIDOR_LIMIT)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=_entry, max_episode_steps=_limit)


# ---------------------------------------------------------------- envs whose reset must restore their whole state
SELF_LIMIT = 200
"""SelfLimitedCartPole's own time limit, in steps since its reset."""


class SelfLimitedCartPole(CartPoleEnv):
    """CartPole that keeps its own time limit (a counter it resets in `reset`) instead of gymnasium's TimeLimit:
    registered without max_episode_steps, it truncates itself after SELF_LIMIT steps."""

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        self.elapsed = 0

    def reset(self, *, seed=None, options=None):
        self.elapsed = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.elapsed += 1
        return obs, reward, terminated, truncated or self.elapsed >= SELF_LIMIT, info


ORCHARD_CELLS = 6
ORCHARD_LIMIT = 12


class Orchard(gym.Env):
    """A row of trees: walking onto a tree with fruit picks it (reward 1), and the fruit is gone for the rest of
    the episode; `reset` puts the walker back at cell 0 and the fruit back on every tree. The fruit is not
    observed (the observation is the walker's cell), so only the rewards say whether it was put back."""

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (ORCHARD_CELLS,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.cell = 0
        self.fruit = self.ripe()

    @staticmethod
    def ripe() -> np.ndarray:
        return np.arange(ORCHARD_CELLS) > 0

    def _obs(self) -> np.ndarray:
        return np.eye(ORCHARD_CELLS, dtype=np.float32)[self.cell]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell, self.fruit = 0, self.ripe()
        return self._obs(), {}

    def step(self, action):
        self.cell = int(np.clip(self.cell + (1 if int(action) == 1 else -1), 0, ORCHARD_CELLS - 1))
        reward = float(self.fruit[self.cell])
        self.fruit[self.cell] = False
        return self._obs(), reward, False, False, {}


class NoisyBandit(Bandit):
    """A bandit whose rewards come from a generator nothing seeds (the OS's entropy), and whose episodes last 4
    steps: stochastic whatever the seed, so a check that replays its episodes cannot judge it, and must say
    nothing."""

    _unseeded = np.random.default_rng()

    def step(self, action):
        return np.ones(1, np.float32), float(self._unseeded.normal() + int(action)), False, False, {}


for _name, _entry, _limit in (("SelfLimitedCartPole-v0", SelfLimitedCartPole, None),
                              ("Orchard-v0", Orchard, ORCHARD_LIMIT), ("NoisyBandit-v0", NoisyBandit, 4)):
    if _name not in gym.registry:
        gym.register(_name, entry_point=_entry, max_episode_steps=_limit)
