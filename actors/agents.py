"""Probe agents: fixed, known behaviour through the same actor code path.

With learning switched off they separate "the env and actors are broken"
from "the learner is broken": a random agent on CartPole must score about
22, a fixed-action agent on probe 4 must earn exactly its action's reward.
`rlvitals doctor --env` steps a user's env with them. They implement the same
`act`/`age` interface as the learner's network.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch


class RandomAgent:
    """Uniformly random actions, from its own seeded generator."""

    age = 0

    def __init__(self, action_space: gym.Space, seed: int):
        self.action_space = action_space
        self.generator = torch.Generator().manual_seed(int(seed))

    def act(self, obs: torch.Tensor):
        n = obs.shape[0]
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            actions = torch.randint(int(space.n), (n,), generator=self.generator)
            params = torch.zeros(n, int(space.n))
            logp = torch.full((n,), -math.log(int(space.n)))
        else:
            low = torch.as_tensor(space.low, dtype=torch.float32)
            high = torch.as_tensor(space.high, dtype=torch.float32)
            actions = low + (high - low) * torch.rand((n, *space.shape), generator=self.generator)
            params = torch.zeros(n, 2 * space.shape[0])
            logp = torch.full((n,), -float(torch.log(high - low).sum()))
        return actions, params, logp


class FixedActionAgent:
    """Always takes the same discrete action."""

    age = 0

    def __init__(self, action_space: gym.Space, action: int):
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"fixed_action agent needs a Discrete action space, got {action_space}")
        if not 0 <= int(action) < int(action_space.n):
            raise ValueError(f"fixed_action={action} is invalid: expected 0 to {int(action_space.n) - 1}")
        self.n = int(action_space.n)
        self.action = int(action)

    def act(self, obs: torch.Tensor):
        n = obs.shape[0]
        actions = torch.full((n,), self.action, dtype=torch.int64)
        params = torch.full((n, self.n), -1e9)
        params[:, self.action] = 0.0
        return actions, params, torch.zeros(n)


class ConstantActionAgent:
    """The fixed agent for continuous (Box) action spaces: always the centre of the box (0 where unbounded)."""

    age = 0

    def __init__(self, action_space: gym.Space):
        if not isinstance(action_space, gym.spaces.Box):
            raise ValueError(f"constant-action agent needs a Box action space, got {action_space}")
        low, high = (np.broadcast_to(b, action_space.shape).astype(np.float64) for b in (action_space.low,
                                                                                         action_space.high))
        centre = np.where(np.isfinite(low) & np.isfinite(high), (low + high) / 2, 0.0)
        centre = np.where(np.isfinite(low) & ~np.isfinite(high), np.maximum(low, 0.0), centre)
        centre = np.where(~np.isfinite(low) & np.isfinite(high), np.minimum(high, 0.0), centre)
        self.action = torch.as_tensor(centre, dtype=torch.float32)

    def act(self, obs: torch.Tensor):
        n = obs.shape[0]
        actions = self.action.expand(n, *self.action.shape).clone()
        params = torch.cat([actions, torch.full_like(actions, -20.0)], -1)  # mean, log-std: all but a point
        return actions, params, torch.zeros(n)


def fixed_agent(action_space: gym.Space, action: int = 0):
    """The fixed probe agent for any supported action space: action `action` (Discrete) or the box's centre."""
    if isinstance(action_space, gym.spaces.Box):
        return ConstantActionAgent(action_space)
    return FixedActionAgent(action_space, action)
