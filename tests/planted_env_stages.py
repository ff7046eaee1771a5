"""Planted faults in the env, the actor's witness, the preprocessing
and the counting at the lowest level: each breaks one stage's output given its
own inputs (issue 31), planted from outside the product code."""

from __future__ import annotations

import pytest
from planted_bug import PlantedBug


def reward_transform_wrapped_over_the_env(mp: pytest.MonkeyPatch) -> None:
    """The runner gets its envs with an undeclared reward transform wrapped around them (a scaling left in the
    env construction): what is stored is not what the env returned."""
    from gymnasium.wrappers.vector import TransformReward

    from rlvitals.actors import runner

    original = runner.make_vector_env

    def make_vector_env(*args, **kwargs):
        return TransformReward(original(*args, **kwargs), lambda reward: reward * 0.01)

    mp.setattr(runner, "make_vector_env", make_vector_env)


def time_limit_counter_not_reset(mp: pytest.MonkeyPatch) -> None:
    """The env's time limit keeps counting across resets: after the first episode, every episode is truncated
    after one step."""
    from gymnasium.wrappers import TimeLimit

    original = TimeLimit.reset

    def reset(self, **kwargs):
        elapsed = self._elapsed_steps
        out = original(self, **kwargs)
        if elapsed is not None:
            self._elapsed_steps = elapsed
        return out

    mp.setattr(TimeLimit, "reset", reset)


RAY = {"mode": "ray", "num_actors": 2, "torch_threads": 1}
"""Ray mode with two actors (as planted_bugs.RAY; not imported from there, which imports this module)."""


ENV_STAGE_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("reward_transform_wrapped_over_the_env", "actor", "run", reward_transform_wrapped_over_the_env,
               invariant="boundary_rewards",
               what="the runner's vector env wrapped in a reward scaling by 0.01 that nothing declares"),
    PlantedBug("ray_reward_transform_wrapped_over_the_env", "actor", "run", reward_transform_wrapped_over_the_env,
               overrides=RAY, mode="ray", in_actors=True, invariant="boundary_rewards",
               what="as reward_transform_wrapped_over_the_env, in Ray's actor processes"),
    PlantedBug("time_limit_counter_not_reset", "env", "run", time_limit_counter_not_reset, env="Pendulum-v1",
               invariant="env_time_limit",
               what="the env's TimeLimit keeps its step count across resets: after the first episode every "
                    "episode is truncated after one step"),
    PlantedBug("time_limit_counter_not_reset_acrobot", "env", "run", time_limit_counter_not_reset,
               env="Acrobot-v1", invariant="env_time_limit",
               what="as time_limit_counter_not_reset, on Acrobot (episodes also end by termination)"),
)
