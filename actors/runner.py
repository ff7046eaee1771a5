"""The env runner: steps a vector env with a policy and packs rollouts."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import torch

from .envs import make_vector_env
from .rollout import EpisodeStats, Rollout


class EnvStepError(RuntimeError):
    """The environment raised or returned something unusable; names env id, seed and step."""


class EnvRunner:
    """Steps `num_envs` copies of an env together; one batched policy call per step.

    The runner owns the envs and the episode bookkeeping that spans rollouts;
    the policy is passed to `collect`, so whoever owns the network (the
    learner in local mode, a weight cache in Ray mode) stays in charge of it.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, actor_id: int = 0, atari_options=None):
        self.env_id = env_id
        self.seed = int(seed)
        self.actor_id = actor_id
        self.env = make_vector_env(env_id, num_envs, atari_options)
        self.num_envs = num_envs
        self.obs_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)
        if not self.discrete:
            self._low, self._high = self.action_space.low, self.action_space.high
        self.obs_shape = self._obs_shape(self.obs_space)
        self.obs_dtype = np.float32 if not isinstance(self.obs_space, gym.spaces.Box) or self.obs_space.dtype != np.uint8 else np.uint8
        self.steps_taken = 0
        try:
            obs, _ = self.env.reset(seed=self.seed)
        except Exception as exc:
            raise EnvStepError(f"env {self.env_id!r} (seed {self.seed}) raised {type(exc).__name__} at "
                               f"reset (step 0): {exc}") from exc
        self.obs = self._as_obs(obs)
        self.prev_done = np.zeros(num_envs, dtype=bool)
        self.episode_return = np.zeros(num_envs, dtype=np.float64)
        self.episode_length = np.zeros(num_envs, dtype=np.int64)

    @staticmethod
    def _obs_shape(space: gym.Space) -> tuple[int, ...]:
        return () if isinstance(space, gym.spaces.Discrete) else tuple(space.shape)

    def _as_obs(self, obs) -> np.ndarray:
        arr = np.asarray(obs)
        if arr.shape != (self.num_envs, *self.obs_shape):
            raise EnvStepError(
                f"env {self.env_id!r} (seed {self.seed}) returned observations of shape {arr.shape} "
                f"at step {self.steps_taken}; its observation space says {(self.num_envs, *self.obs_shape)}")
        return arr.astype(self.obs_dtype, copy=False)

    def collect(self, policy, num_steps: int) -> Rollout:
        """Step every env `num_steps` times with `policy`; return the rollout."""
        n, T = self.num_envs, num_steps
        obs_buf = np.empty((T + 1, n, *self.obs_shape), dtype=self.obs_dtype)
        rewards = np.empty((T, n), dtype=np.float32)
        terminated = np.empty((T, n), dtype=bool)
        truncated = np.empty((T, n), dtype=bool)
        valid = np.empty((T, n), dtype=bool)
        actions = params = logps = None
        done_returns, done_lengths, successes = [], [], []
        inference_s = step_s = 0.0
        age = int(policy.age)

        for t in range(T):
            obs_buf[t] = self.obs
            valid[t] = ~self.prev_done
            t0 = time.perf_counter()
            with torch.no_grad():
                action, param, logp = policy.act(torch.from_numpy(self.obs))
            if actions is None:  # shapes are known only after the first call
                actions = torch.empty((T, *action.shape), dtype=action.dtype)
                params = torch.empty((T, *param.shape), dtype=torch.float32)
                logps = torch.empty((T, n), dtype=torch.float32)
            actions[t], params[t], logps[t] = action, param, logp
            env_action = action.numpy()
            if not self.discrete:
                env_action = np.clip(env_action, self._low, self._high)
            t1 = time.perf_counter()
            try:
                obs, raw_reward, term, trunc, info = self.env.step(env_action)
            except Exception as exc:
                raise EnvStepError(f"env {self.env_id!r} (seed {self.seed}) raised {type(exc).__name__} at "
                                   f"step {self.steps_taken}: {exc}") from exc
            # NaN/inf rewards are numbers: the learner's non-finite guard deals with them. Anything
            # that is not a number at all (None, text) is the env's bug, reported here.
            reward = np.asarray(raw_reward)
            if reward.dtype.kind not in "biuf" or reward.shape != (n,):
                bad = raw_reward[0] if isinstance(raw_reward, (list, tuple, np.ndarray)) and len(raw_reward) else raw_reward
                raise EnvStepError(f"env {self.env_id!r} (seed {self.seed}) returned reward {bad!r} at step "
                                   f"{self.steps_taken}; expected {n} numbers")
            reward = reward.astype(np.float32, copy=False)
            step_s += time.perf_counter() - t1
            inference_s += t1 - t0
            self.obs = self._as_obs(obs)
            self.steps_taken += 1
            rewards[t], terminated[t], truncated[t] = reward, term, trunc

            live = valid[t]
            self.episode_return += reward * live
            self.episode_length += live
            done = (term | trunc) & live
            if done.any():
                done_returns.append(self.episode_return[done])
                done_lengths.append(self.episode_length[done])
                successes.append(_successes(info, done))
                self.episode_return[done] = 0.0
                self.episode_length[done] = 0
            self.prev_done = term | trunc
        obs_buf[T] = self.obs

        episodes = EpisodeStats(
            returns=np.concatenate(done_returns) if done_returns else np.zeros(0),
            lengths=np.concatenate(done_lengths) if done_lengths else np.zeros(0, np.int64),
            successes=np.concatenate(successes) if successes else np.zeros(0),
        )
        return Rollout(
            obs=torch.from_numpy(obs_buf), actions=actions, rewards=torch.from_numpy(rewards),
            terminated=torch.from_numpy(terminated), truncated=torch.from_numpy(truncated),
            valid=torch.from_numpy(valid), behaviour_params=params, behaviour_logp=logps,
            policy_age=age, actor_id=self.actor_id, episodes=episodes,
            timings={"env_step": step_s, "inference": inference_s},
            valid_count=int(valid.sum()),
        )

    def close(self) -> None:
        self.env.close()


def _successes(info: dict, done: np.ndarray) -> np.ndarray:
    """Success flags of the finished episodes whose env reports one; empty otherwise."""
    for key in ("is_success", "success"):
        if key in info:
            mask = np.asarray(info.get(f"_{key}", np.ones_like(done)), dtype=bool) & done
            return np.asarray(info[key], dtype=np.float64)[mask]
    return np.zeros(0)
