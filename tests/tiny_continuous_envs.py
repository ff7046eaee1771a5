"""A tiny continuous-action user env solved exactly within a few updates (tests/test_learner_stages.py).

Used as `tiny_continuous_envs:TargetBandit-v0` with tests/ on the path: a Gaussian policy converges on it, its
spread narrows and its gradients vanish, none of which is a fault.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class TargetBandit(gym.Env):
    """One step per episode: the reward is minus the squared distance of the action from 0.5 (best: 0)."""

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.ones(1, np.float32), {}

    def step(self, action):
        return np.ones(1, np.float32), -float((np.asarray(action)[0] - 0.5) ** 2), True, False, {}


if "TargetBandit-v0" not in gym.registry:
    gym.register("TargetBandit-v0", entry_point=TargetBandit)
