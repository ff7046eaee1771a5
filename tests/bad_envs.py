"""Envs that misbehave, for tests/test_bad_inputs.py and tests/test_run_status.py; used as `bad_envs:EnvId`
with tests/ on PYTHONPATH.

The environment variable BAD_ENVS_ON_IMPORT makes importing this module fail
(`raise`) or call sys.exit (`exit`), as a user's broken env module might.
(An env whose observation shape changes is tests/test_resume_validation.py's SHAPED_ENV.)
"""

from __future__ import annotations

import os
import sys

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

if os.environ.get("BAD_ENVS_ON_IMPORT") == "raise":
    raise RuntimeError("bad_envs refuses to be imported")
if os.environ.get("BAD_ENVS_ON_IMPORT") == "exit":
    sys.exit(3)


class ResetRaises(CartPoleEnv):
    def reset(self, **kwargs):
        raise RuntimeError("the simulator is not running")


class ResetReturnsWrongType(CartPoleEnv):
    def reset(self, **kwargs):
        super().reset(**kwargs)
        return "not an observation"


class StepRaises(CartPoleEnv):
    def step(self, action):
        raise RuntimeError("the simulator crashed")


class StepRaisesLater(CartPoleEnv):
    """Steps as CartPole does, then raises at its 200th step: past the pre-flight check, in the middle of a run."""

    steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps >= 200:
            raise RuntimeError("the simulator crashed")
        return super().step(action)


class SmallImages(gym.Env):
    """A correct env whose 12x12 RGB images are smaller than the Nature trunk takes (its convolutions need 36)."""

    observation_space = gym.spaces.Box(0, 255, (12, 12, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((12, 12, 3), np.uint8), {}

    def step(self, action):
        return np.zeros((12, 12, 3), np.uint8), 0.0, False, False, {}


for _env_id, _entry in (("ResetRaises-v0", ResetRaises), ("ResetWrongType-v0", ResetReturnsWrongType),
                        ("StepRaises-v0", StepRaises), ("StepRaisesLater-v0", StepRaisesLater),
                        ("SmallImages-v0", SmallImages)):
    if _env_id not in gym.registry:
        gym.register(_env_id, entry_point=_entry, max_episode_steps=500)
