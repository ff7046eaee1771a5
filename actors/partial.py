"""Partially observable tasks: what a feed-forward policy cannot learn and a recurrent one must.

rlvitals/CartPoleNoVelocity-v1
    CartPole-v1 with the cart's and the pole's velocities removed from the observation (position and
    angle remain): the state is recoverable only from successive observations. Same dynamics, time
    limit (500) and solved threshold (475) as CartPole-v1; the vector version keeps CartPole's fast
    vectorised implementation.
rlvitals/MemoryProbe-v0 (the doctor's memory probe)
    Step 0 shows a cue, +1 or -1 at random; the next `delay` steps show 0; then the episode ends on
    the agent's action, rewarded +1 if it names the cue (action 1 for +1, action 0 for -1) and -1 if
    not. A policy without memory sees only 0 when it must answer: its best expected return is 0. A
    correct recurrent policy reaches +1 within a few thousand steps.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv

SEEN = np.array([0, 2])
"""CartPole's observation indices kept: cart position and pole angle (velocities 1 and 3 are hidden)."""

CARTPOLE_NO_VELOCITY = "rlvitals/CartPoleNoVelocity-v1"
MEMORY_PROBE = "rlvitals/MemoryProbe-v0"


def _position_and_angle(space: gym.spaces.Box) -> gym.spaces.Box:
    return gym.spaces.Box(space.low[SEEN], space.high[SEEN], dtype=space.dtype)


class CartPoleNoVelocity(gym.ObservationWrapper):
    def __init__(self, **kwargs):
        super().__init__(CartPoleEnv(**kwargs))
        self.observation_space = _position_and_angle(self.env.observation_space)

    def observation(self, observation):
        return observation[SEEN]


class CartPoleNoVelocityVector(gym.vector.VectorObservationWrapper):
    def __init__(self, num_envs: int = 1, **kwargs):
        super().__init__(CartPoleVectorEnv(num_envs=num_envs, **kwargs))
        self.single_observation_space = _position_and_angle(self.env.single_observation_space)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)

    def observations(self, observations):
        return observations[:, SEEN]


class MemoryProbe(gym.Env):
    """Name the cue shown `delay` steps ago (see the module's docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, delay: int = 4):
        if not (isinstance(delay, int) and delay >= 1):
            raise ValueError(f"delay={delay!r} is invalid: expected an integer >= 1")
        self.delay = delay
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._cue, self._t = 1.0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._cue, self._t = float(self.np_random.choice([-1.0, 1.0])), 0
        return np.array([self._cue], np.float32), {}

    def step(self, action):
        self._t += 1
        if self._t <= self.delay:
            return np.zeros(1, np.float32), 0.0, False, False, {}
        named = 1.0 if int(action) == 1 else -1.0
        return np.zeros(1, np.float32), (1.0 if named == self._cue else -1.0), True, False, {}


def register_partial() -> None:
    if CARTPOLE_NO_VELOCITY not in gym.registry:
        cartpole = gym.spec("CartPole-v1")
        gym.register(CARTPOLE_NO_VELOCITY, entry_point=CartPoleNoVelocity,
                     vector_entry_point=CartPoleNoVelocityVector, max_episode_steps=cartpole.max_episode_steps,
                     reward_threshold=cartpole.reward_threshold)
    if MEMORY_PROBE not in gym.registry:
        gym.register(MEMORY_PROBE, entry_point=MemoryProbe, max_episode_steps=64, disable_env_checker=True)


register_partial()
