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


def own_time_limit_counter_not_reset(mp: pytest.MonkeyPatch) -> None:
    """A user env that keeps its own time limit (no gymnasium TimeLimit) forgets to zero its counter in reset():
    once an env has taken SELF_LIMIT steps, every later episode is truncated after one step."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv
    from tiny_envs import SelfLimitedCartPole

    def reset(self, *, seed=None, options=None):   # the counter left as it was
        return CartPoleEnv.reset(self, seed=seed, options=options)

    mp.setattr(SelfLimitedCartPole, "reset", reset)


def orchard_fruit_not_restored(mp: pytest.MonkeyPatch) -> None:
    """A user env's reset() puts the walker back but not the fruit it picked: after an env's first episode the
    trees are bare, and every later episode's rewards are 0 (what is observed, the walker's cell, is unchanged)."""
    import gymnasium as gym
    from tiny_envs import Orchard

    def reset(self, *, seed=None, options=None):
        gym.Env.reset(self, seed=seed)
        self.cell = 0
        return self._obs(), {}

    mp.setattr(Orchard, "reset", reset)


def _discard_every_other_rollout(mp: pytest.MonkeyPatch, mine) -> None:
    """Where `mine()` holds (asked once), the runner collects a rollout and loses it, without a count, before
    each second one it hands over: its env steps were taken, and no counter of the actor says so."""
    from rlvitals.actors.runner import EnvRunner

    original = EnvRunner.collect
    state: dict = {}

    def collect(self, policy, num_steps):
        if "mine" not in state:
            state["mine"], state["calls"] = mine(), 0
        state["calls"] += 1
        if state["mine"] and state["calls"] % 2 == 0:
            original(self, policy, num_steps)
        return original(self, policy, num_steps)

    mp.setattr(EnvRunner, "collect", collect)


def runner_discards_every_other_rollout(mp: pytest.MonkeyPatch) -> None:
    _discard_every_other_rollout(mp, lambda: True)


def one_actor_discards_every_other_rollout(mp: pytest.MonkeyPatch) -> None:
    """As runner_discards_every_other_rollout, in the one actor process that claims the bug."""
    from planted_bugs import claim_for_this_process

    _discard_every_other_rollout(mp, claim_for_this_process)


RAY = {"mode": "ray", "num_actors": 2, "torch_threads": 1}
"""Ray mode with two actors (as planted_bugs.RAY; not imported from there, which imports this module)."""


def runner_reads_observations_at_half_precision(mp):
    """The runner rounds each observation the env returns to float16 before acting on it and storing it: actor and
    learner agree with each other, both on an observation the env never emitted."""
    from rlvitals.actors.runner import EnvRunner

    original = EnvRunner._as_obs

    def _as_obs(self, obs):
        out = original(self, obs)
        return out.astype("float16").astype(out.dtype) if out.dtype.kind == "f" else out

    mp.setattr(EnvRunner, "_as_obs", _as_obs)


def runner_acts_with_its_fallback_everywhere(mp):
    """The runner treats every row as unsafe and acts with its zero-mean fallback policy, recording the
    fallback's parameters: its record agrees with its draws, but no action comes from the policy network."""
    from rlvitals.actors.runner import EnvRunner

    original = EnvRunner._act

    def _act(self, policy, obs):
        action, param, _ = original(self, policy, obs)
        actions, params, logp = self._fallback_act(len(obs), param.shape[-1])
        return actions.to(action.dtype), params, logp

    mp.setattr(EnvRunner, "_act", _act)


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
    PlantedBug("own_time_limit_counter_not_reset", "env", "run", own_time_limit_counter_not_reset,
               env="tiny_envs:SelfLimitedCartPole-v0", invariant="env_reset_restores",
               what="a user env with its own time limit (no TimeLimit) does not zero its step counter in reset(): "
                    "after SELF_LIMIT steps every episode is truncated after one step"),
    PlantedBug("orchard_fruit_not_restored", "env", "run", orchard_fruit_not_restored,
               env="tiny_envs:Orchard-v0", invariant="env_reset_restores",
               what="a user env's reset() does not put back the fruit an episode picked: every later episode's "
                    "rewards are 0, what is observed unchanged"),
    PlantedBug("runner_discards_every_other_rollout", "actor", "run", runner_discards_every_other_rollout,
               invariant="env_steps_accounted",
               what="the runner collects a rollout and loses it before every second one it hands over"),
    PlantedBug("ray_one_actor_of_four_discards_every_other_rollout", "actor", "run",
               one_actor_discards_every_other_rollout, overrides={**RAY, "num_actors": 4, "actor_cpus": 0.25},
               mode="ray", in_actors=True, one_actor=True, invariant="env_steps_accounted",
               what="one Ray actor of four collects a rollout and loses it before every second one it delivers, "
                    "its counters none the wiser"),
    PlantedBug("runner_reads_observations_at_half_precision", "actor", "run",
               runner_reads_observations_at_half_precision, env="Pendulum-v1",
               invariant="observations_changed_before_acting",
               what="the runner rounds the env's observations to float16 before acting on and storing them"),
    PlantedBug("runner_acts_with_its_fallback_everywhere", "actor", "run", runner_acts_with_its_fallback_everywhere,
               invariant="acted_with_its_network",
               what="the runner acts with its fallback policy on every row and records the fallback's parameters"),
    PlantedBug("runner_acts_with_its_fallback_everywhere_pendulum", "actor", "run",
               runner_acts_with_its_fallback_everywhere, env="Pendulum-v1", invariant="acted_with_its_network",
               what="as runner_acts_with_its_fallback_everywhere, with a Gaussian policy"),
)
