"""The env runner: steps a vector env with a policy and packs rollouts."""

from __future__ import annotations

import math
import time

import gymnasium as gym
import numpy as np
import torch

from .acting_check import ActingCheck
from .env_step_cost import EnvStepCost, gymnasium_vector_env
from .envs import find_witness, make_vector_env
from .inference_cost import ForwardCost, bare_forward
from .rollout import EpisodeStats, Rollout
from .witness import Witness


class EnvStepError(RuntimeError):
    """The environment raised or returned something unusable; names env id, seed and step."""


SAFE_OBS_LIMIT = 1e30
"""Observation values beyond this magnitude (or NaN/inf) never reach the policy network.

A float32 first layer sums products of inputs and weights: inputs near 1e38 overflow to
inf, inf - inf is NaN, and NaN logits make action sampling fail. Rows holding such
values are acted on with a fixed zero-mean policy instead (see EnvRunner._act); the
observations themselves are kept as they came, so the non-finite guard still sees them."""
ACTING_CHECK_SEED = 0x5EED
"""Offsets the acting check's own generator from the env seeds."""


_step_started: float | None = None
"""perf_counter() when the env step now in progress began (None between steps); the stop
watchdog (rlvitals.signals) reads it to tell a hung env step from a slow update."""


def env_step_seconds() -> float:
    """How long the env step now in progress has taken so far; 0 when no env step is in progress."""
    started = _step_started
    return 0.0 if started is None else time.perf_counter() - started


class EnvRunner:
    """Steps `num_envs` copies of an env together; one batched policy call per step.

    The runner owns the envs and the episode bookkeeping that spans rollouts;
    the policy is passed to `collect`, so whoever owns the network (the
    learner in local mode, a weight cache in Ray mode) stays in charge of it.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, actor_id: int = 0, atari_options=None,
                 return_discount: float | None = None, env_kwargs: dict | None = None):
        self.env_id = env_id
        self.seed = int(seed)
        self.actor_id = actor_id
        # The witness sits directly on the env gymnasium built, below anything wrapped around it: what the envs
        # received and returned, recorded apart from the runner's own buffers, travels on each rollout for the
        # learner to compare (actors/witness.py).
        self.env = make_vector_env(env_id, num_envs, atari_options, env_kwargs, witness_seed=seed)
        self.witness = find_witness(self.env)
        self.num_envs = num_envs
        self.obs_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)
        if not self.discrete:
            self._low, self._high = self.action_space.low, self.action_space.high
        # A Discrete(n, start=s) space takes s..s+n-1: the policy's index plus s (the rollout stores the index).
        self._action_start = int(self.action_space.start) if self.discrete else 0
        self.obs_shape = self._obs_shape(self.obs_space)
        pixels = isinstance(self.obs_space, gym.spaces.Box) and self.obs_space.dtype == np.uint8
        self.obs_dtype = np.uint8 if pixels else np.float32
        self.steps_taken = 0
        self._check_obs = self.obs_dtype != np.uint8
        self._fallback = torch.Generator().manual_seed(self.seed)  # draws for rows the policy cannot act on
        self.unsafe_rows = 0
        """Env rows acted on with the fallback policy since this runner started (non-finite or huge obs)."""
        try:
            obs, _ = self.env.reset(seed=self.seed)
        except Exception as exc:
            raise EnvStepError(f"env {self.env_id!r} (seed {self.seed}) raised {type(exc).__name__} at "
                               f"reset (step 0): {exc}") from exc
        self.obs = self._as_obs(obs)
        self.prev_done = np.zeros(num_envs, dtype=bool)
        self.episode_return = np.zeros(num_envs, dtype=np.float64)
        self.episode_length = np.zeros(num_envs, dtype=np.int64)
        self.return_discount = return_discount
        """Reward scaling: the discount of the running return each rollout carries (None: not kept)."""
        self.discounted_return = np.zeros(num_envs, dtype=np.float64)
        self.state: torch.Tensor | None = None
        """A recurrent policy's state of each env [N, 2, H], carried across rollouts (None: none yet)."""
        self.starting = np.ones(num_envs, dtype=bool)
        """The next step begins an episode: a recurrent policy's state is zeroed before it."""
        self.state_age = -1
        """Age of the network that computed `state` (-1: the empty state)."""
        self.rollouts_collected = 0
        """Rollouts this runner made so far: each rollout's sequence number."""
        self.forward_cost = ForwardCost()
        """The reference the inference phase is judged against (actors/inference_cost.py)."""
        self.acting_check = ActingCheck(seed + ACTING_CHECK_SEED, SAFE_OBS_LIMIT)
        """Whether the actor acted with its own network on what it stored (actors/acting_check.py)."""
        self.env_step_cost = EnvStepCost(
            lambda: Witness(gymnasium_vector_env(env_id, num_envs, atari_options, env_kwargs), seed), seed)
        """The reference the env-step phase is judged against: a copy of the env under the project's own witness,
        never the run's (env_step_cost.py)."""

    @staticmethod
    def _obs_shape(space: gym.Space) -> tuple[int, ...]:
        return () if isinstance(space, gym.spaces.Discrete) else tuple(space.shape)

    def _as_obs(self, obs) -> np.ndarray:
        arr = np.asarray(obs)
        if arr.shape != (self.num_envs, *self.obs_shape):
            raise EnvStepError(
                f"env {self.env_id!r} (seed {self.seed}) returned observations of shape {arr.shape} "
                f"at step {self.steps_taken}; its observation space says {(self.num_envs, *self.obs_shape)}")
        if arr.dtype == self.obs_dtype:
            return arr
        with np.errstate(over="ignore", invalid="ignore"):  # float64 1e300 becomes inf: the guard reports it
            return arr.astype(self.obs_dtype)

    def _act(self, policy, obs: np.ndarray):
        """policy.act on the observations; rows it cannot safely act on get the fallback policy.

        Unsafe rows: an observation holding NaN, inf or a value beyond SAFE_OBS_LIMIT (the
        policy sees zeros there instead), or, for continuous actions, an action or distribution
        parameter that came back non-finite. Their action, parameters and log-probability are
        replaced by a draw of the zero-mean fallback policy (uniform logits, or a unit Gaussian
        around 0), so the stored behaviour matches what was done. The checks run on host arrays
        the runner holds anyway: no extra device round trip per step.
        """
        unsafe = None
        if self._check_obs:
            safe = (np.abs(obs) <= SAFE_OBS_LIMIT).reshape(len(obs), -1).all(1)  # NaN compares False
            if not safe.all():
                unsafe = ~safe
                obs = np.where(unsafe.reshape(-1, *([1] * len(self.obs_shape))), 0, obs).astype(obs.dtype)
        if self.state is not None:
            action, param, logp, self.state = policy.act_recurrent(torch.from_numpy(obs), self.state,
                                                                   torch.from_numpy(self.starting))
        else:
            action, param, logp = policy.act(torch.from_numpy(obs))
        if not self.discrete:   # numpy on the tensors' own memory: a torch reduction costs ~5x more per call
            action_np, param_np = action.numpy(), param.numpy()
            if not (np.isfinite(action_np).all() and np.isfinite(param_np).all()):
                bad = ~(np.isfinite(action_np).all(-1) & np.isfinite(param_np).all(-1))
                unsafe = bad if unsafe is None else unsafe | bad
        if unsafe is not None:
            action, param, logp = action.clone(), param.clone(), logp.clone()
            rows = torch.from_numpy(np.flatnonzero(unsafe))
            a, p, lp = self._fallback_act(len(rows), param.shape[-1])
            action[rows], param[rows], logp[rows] = a.to(action.dtype), p, lp
            self.unsafe_rows += len(rows)
        return action, param, logp

    def _fallback_act(self, k: int, num_params: int):
        """k draws of the zero-mean policy: (actions, params, log-probs) in the network's formats."""
        if self.discrete:
            n = int(self.action_space.n)
            actions = torch.randint(n, (k,), generator=self._fallback)
            return actions, torch.zeros(k, num_params), torch.full((k,), -math.log(n))
        dim = num_params // 2
        actions = torch.randn((k, dim), generator=self._fallback)  # params: mean 0, log-std 0
        logp = (-0.5 * actions.pow(2) - 0.5 * math.log(2 * math.pi)).sum(-1)
        return actions, torch.zeros(k, num_params), logp

    def collect(self, policy, num_steps: int) -> Rollout:
        """Step every env `num_steps` times with `policy`; return the rollout."""
        global _step_started
        n, T = self.num_envs, num_steps
        obs_buf = np.empty((T + 1, n, *self.obs_shape), dtype=self.obs_dtype)
        rewards = np.empty((T, n), dtype=np.float32)
        terminated = np.empty((T, n), dtype=bool)
        truncated = np.empty((T, n), dtype=bool)
        valid = np.empty((T, n), dtype=bool)
        actions = params = logps = None
        returns = np.empty((T, n), dtype=np.float32) if self.return_discount is not None else None
        done_returns, done_lengths, successes = [], [], []
        inference_s = step_s = inference_cpu_s = step_cpu_s = 0.0
        age = int(policy.age)
        # The weights cannot change during a collection: one fingerprint of what acted, for the learner to check.
        checksums = (policy.weights_checksum(),) if hasattr(policy, "weights_checksum") else ()
        self.witness.begin(T)
        recurrent = getattr(policy, "recurrent_size", 0) > 0
        if not recurrent:
            self.state = None
        elif self.state is None:
            self.state = policy.initial_state(n)
        initial = (self.state.clone(), torch.from_numpy(self.starting.copy()), self.state_age) if recurrent else None
        self.forward_cost.measure(policy, self.obs)
        # The reference steps a copy of the env: a step that blocks there is the env's, as the watchdog must see.
        _step_started = time.perf_counter()
        try:
            self.env_step_cost.measure(bare_forward(policy, self.obs))   # a rollout's steps alternate with it
        finally:
            _step_started = None

        for t in range(T):
            obs_buf[t] = self.obs
            valid[t] = ~self.prev_done
            t0, cpu0 = time.perf_counter(), time.process_time()
            with torch.no_grad():
                action, param, logp = self._act(policy, self.obs)
            inference_cpu_s += time.process_time() - cpu0
            env_action = action.numpy()
            if actions is None:  # shapes are known only after the first call; numpy rows: a third of torch's cost
                actions = np.empty((T, *env_action.shape), dtype=env_action.dtype)
                params = np.empty((T, *param.shape), dtype=np.float32)
                logps = np.empty((T, n), dtype=np.float32)
            actions[t], params[t], logps[t] = env_action, param.numpy(), logp.numpy()
            if not self.discrete:
                env_action = np.clip(env_action, self._low, self._high)
            elif self._action_start:
                env_action = env_action + self._action_start
            t1 = _step_started = time.perf_counter()
            step_cpu0 = time.thread_time()
            try:
                obs, raw_reward, term, trunc, info = self.env.step(env_action)
            except Exception as exc:
                raise EnvStepError(f"env {self.env_id!r} (seed {self.seed}) raised {type(exc).__name__} at "
                                   f"step {self.steps_taken}: {exc}") from exc
            finally:
                _step_started = None
            # NaN/inf rewards are numbers: the learner's non-finite guard deals with them. Anything
            # that is not a number at all (None, text) is the env's bug, reported here.
            reward = np.asarray(raw_reward)
            if reward.dtype.kind not in "biuf" or reward.shape != (n,):
                nonempty_sequence = isinstance(raw_reward, (list, tuple, np.ndarray)) and len(raw_reward)
                bad = raw_reward[0] if nonempty_sequence else raw_reward
                raise EnvStepError(f"env {self.env_id!r} (seed {self.seed}) returned reward {bad!r} at step "
                                   f"{self.steps_taken}; expected {n} numbers")
            reward = reward.astype(np.float32, copy=False)
            step_cpu_s += time.thread_time() - step_cpu0
            step_s += time.perf_counter() - t1
            inference_s += t1 - t0
            self.obs = self._as_obs(obs)
            self.steps_taken += 1
            rewards[t], terminated[t], truncated[t] = reward, term, trunc

            live = valid[t]
            self.episode_return += reward * live
            self.episode_length += live
            done = (term | trunc) & live
            if returns is not None:   # raw rewards: the scaling is the learner's
                self.discounted_return = np.where(live, self.discounted_return * self.return_discount + reward,
                                                  self.discounted_return)
                returns[t] = self.discounted_return
                self.discounted_return[done] = 0.0
            if done.any():
                done_returns.append(self.episode_return[done])
                done_lengths.append(self.episode_length[done])
                successes.append(_successes(info, done))
                self.episode_return[done] = 0.0
                self.episode_length[done] = 0
            self.prev_done = term | trunc
            self.starting = ~valid[t]   # a reset transition's next observation begins an episode
        obs_buf[T] = self.obs
        acted = self.acting_check.measure(policy, obs_buf, params, self.state is not None)

        episodes = EpisodeStats(
            returns=np.concatenate(done_returns) if done_returns else np.zeros(0),
            lengths=np.concatenate(done_lengths) if done_lengths else np.zeros(0, np.int64),
            successes=np.concatenate(successes) if successes else np.zeros(0),
        )
        return Rollout(
            obs=torch.from_numpy(obs_buf), actions=torch.from_numpy(actions), rewards=torch.from_numpy(rewards),
            terminated=torch.from_numpy(terminated), truncated=torch.from_numpy(truncated),
            valid=torch.from_numpy(valid), behaviour_params=torch.from_numpy(params),
            behaviour_logp=torch.from_numpy(logps),
            policy_age=age, actor_id=self.actor_id, episodes=episodes,
            timings={"env_step": step_s, "inference": inference_s, "inference_cpu": inference_cpu_s,
                     "env_step_cpu": step_cpu_s, **self.forward_cost.reference(), **self.env_step_cost.reference()},
            valid_count=int(valid.sum()), weights_checksums=checksums,
            discounted_returns=None if returns is None else torch.from_numpy(returns),
            witness=(self.witness.take(),), acting_gaps=(acted,),
            **self._recurrent_fields(initial, age), sequence=self._next_sequence(),
        )

    def _next_sequence(self) -> int:
        self.rollouts_collected += 1
        return self.rollouts_collected - 1

    def _recurrent_fields(self, initial: tuple | None, age: int) -> dict:
        """A recurrent policy's record of the rollout: the state each env began with, whether its first step
        began an episode, and the age of the network that computed that state. The next rollout's state is
        this rollout's network's."""
        if initial is None:
            return {}
        self.state_age = age
        state, starts, state_age = initial
        return {"initial_state": state, "initial_starts": starts, "state_age": state_age}

    def close(self) -> None:
        self.env.close()
        self.env_step_cost.close()


def _successes(info: dict, done: np.ndarray) -> np.ndarray:
    """Success flags of the finished episodes whose env reports one; empty otherwise."""
    for key in ("is_success", "success"):
        if key in info:
            mask = np.asarray(info.get(f"_{key}", np.ones_like(done)), dtype=bool) & done
            return np.asarray(info[key], dtype=np.float64)[mask]
    return np.zeros(0)
