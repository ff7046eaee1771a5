"""Probe environments: each adds the smallest possible piece of RL to the one before.

If probe k is learned and probe k+1 is not, the difference between them names
the broken component (see `PROBES` and `rlvitals doctor`). Every probe is
decisive: its correct values and action probabilities are known exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class _Probe(gym.Env):
    """Shared plumbing: one float observation, a reward rule, fixed length."""

    metadata = {"render_modes": []}
    num_actions = 1
    episode_length = 1

    def __init__(self):
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.num_actions)
        self._t = 0
        self._obs = 0.0

    def _observe(self) -> np.ndarray:
        return np.array([self._obs], dtype=np.float32)

    def _first_obs(self) -> float:
        return 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._obs = self._first_obs()
        return self._observe(), {}

    def step(self, action):
        reward = float(self._reward(int(action)))
        self._t += 1
        terminated = self._t >= self.episode_length
        if not terminated:
            self._obs = self._next_obs()
        return self._observe(), reward, terminated, False, {}

    def _reward(self, action: int) -> float:
        raise NotImplementedError

    def _next_obs(self) -> float:
        return 0.0


class ConstantValueProbe(_Probe):
    """1: one action, zero observation, one step, reward +1. V = 1. Tests the value loss and optimizer."""

    def _reward(self, action):
        return 1.0


class DiscountProbe(_Probe):
    """2: one action, two steps, reward +1 at the end. V(first) = gamma, V(second) = 1. Tests discounting.

    The observation is 0 on the first step and 1 on the second: with the same
    observation on both steps no value network could tell them apart.
    """

    episode_length = 2

    def _reward(self, action):
        return 1.0 if self._t == 1 else 0.0

    def _next_obs(self):
        return 1.0


class ObservationRewardProbe(_Probe):
    """3: one action, random +1/-1 observation, one step, reward = observation. V(o) = o. Tests backprop."""

    def _first_obs(self):
        return float(self.np_random.choice([-1.0, 1.0]))

    def _reward(self, action):
        return self._obs


class ActionRewardProbe(_Probe):
    """4: two actions, zero observation, one step, reward +1 for action 1, -1 for action 0. Tests the policy update."""

    num_actions = 2

    def _reward(self, action):
        return 1.0 if action == 1 else -1.0


class ObservationActionProbe(_Probe):
    """5: two actions, random +1/-1 observation, one step, reward +1 when the action matches the sign
    (action 1 for +1, action 0 for -1), else -1. pi(correct|o) = 1, V(o) = 1. Tests batching/pairing."""

    num_actions = 2

    def _first_obs(self):
        return float(self.np_random.choice([-1.0, 1.0]))

    def _reward(self, action):
        return 1.0 if (action == 1) == (self._obs > 0) else -1.0


@dataclass(frozen=True)
class ProbeSpec:
    env_id: str
    cls: type
    implicates: str
    """Component a failure of this probe (after the previous ones pass) points at."""
    observations: tuple[float, ...]
    """Observations to evaluate the learned network on."""
    values: tuple[float | None, ...]
    """Expected V(o) per observation; `None` means depends on gamma (filled in by the checker)."""
    best_actions: tuple[int | None, ...]
    """Action whose probability should approach 1 per observation (None: single-action probe)."""


PROBES: tuple[ProbeSpec, ...] = (
    ProbeSpec("rlvitals/Probe1-v0", ConstantValueProbe, "value loss or optimizer", (0.0,), (1.0,), (None,)),
    ProbeSpec("rlvitals/Probe2-v0", DiscountProbe, "reward discounting", (0.0, 1.0), (None, 1.0), (None, None)),
    ProbeSpec("rlvitals/Probe3-v0", ObservationRewardProbe, "backpropagation through the network",
              (-1.0, 1.0), (-1.0, 1.0), (None, None)),
    ProbeSpec("rlvitals/Probe4-v0", ActionRewardProbe, "advantage calculation, policy loss or policy update",
              (0.0,), (1.0,), (1,)),
    ProbeSpec("rlvitals/Probe5-v0", ObservationActionProbe,
              "batching: observations, actions and rewards paired wrongly, or stale experience",
              (-1.0, 1.0), (1.0, 1.0), (0, 1)),
)


def register_probes() -> None:
    for probe in PROBES:
        if probe.env_id not in gym.registry:
            gym.register(probe.env_id, entry_point=probe.cls, disable_env_checker=True)


register_probes()
