"""The env's time limit re-derived from its own inputs: a probe on each side of gymnasium's TimeLimit wrapper.

gymnasium's `make` wraps an env whose spec (or call) declares `max_episode_steps` = M in a `TimeLimit`, whose
contract is exact: its `reset` starts a new count, each `step` adds one, and a step returns truncated = the
inner env's truncated OR (steps since the reset >= M). In a sync vector env every sub-env is such a stack; the
witness (actors/witness.py) puts `StepsSinceReset` directly under each sub-env's TimeLimit (it counts the
steps and resets the TimeLimit passes down, and keeps the inner env's own truncated flag) and
`TimeLimitDecision` directly over it (it compares the TimeLimit's truncated flag with the contract's).

inv_env_time_limit (per update; NaN when no time-limit decision was seen)
    Number of steps, over the envs of the batch, at which a TimeLimit decided against its contract: the count
    since the reset reached M and the step was not truncated, or the step was truncated while the env below
    said not truncated and the count was not M. Decisions judged: steps at which the count reached M, and
    truncations the TimeLimit added itself. Derivation: the probes see exactly the calls the TimeLimit makes
    to its inner env, so their count is the TimeLimit's correct count; the comparison is of integers and
    flags, exact. An env that truncates for its own reasons (a corridor's exit, a physics limit) says so below
    the TimeLimit and is never judged. False alarms: none. Not judged: envs without gymnasium's TimeLimit in
    their stack (vector entry points such as CartPole's, which keep their own limit; ALE's native vector env;
    `max_episode_steps=-1`). Cost: two wrapper calls per sub-env step, a few scalar operations each.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class StepsSinceReset(gym.Wrapper):
    """Directly under a TimeLimit: the steps it passed down since it passed down a reset, and the inner env's own
    truncated flag at the latest step (the count and the flag the TimeLimit's decision must follow from)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.steps = 0
        self.inner_truncated = False

    def reset(self, **kwargs):
        self.steps, self.inner_truncated = 0, False
        return self.env.reset(**kwargs)

    def step(self, action):
        out = self.env.step(action)
        self.steps += 1
        self.inner_truncated = bool(out[3])
        return out


class TimeLimitDecision(gym.Wrapper):
    """Directly over a TimeLimit: counts its decisions and the wrong ones in `ledger[:, index]`."""

    def __init__(self, time_limit: gym.Env, limit: int, ledger: np.ndarray, index: int):
        super().__init__(time_limit)
        self.limit, self.ledger, self.index = int(limit), ledger, index
        self.below = StepsSinceReset(time_limit.env)
        time_limit.env = self.below

    def step(self, action):
        out = self.env.step(action)
        steps, truncated = self.below.steps, bool(out[3])
        at_limit = steps >= self.limit
        by_limit = truncated and not self.below.inner_truncated
        if at_limit or by_limit:   # rare: episode ends; every other step costs the two comparisons above
            self.ledger[0, self.index] += 1
            self.ledger[1, self.index] += (at_limit and not truncated) or (by_limit and steps != self.limit)
        return out


def probe_time_limits(vector_env: gym.vector.VectorEnv) -> np.ndarray | None:
    """Put the probes around the TimeLimit of each sub-env of a sync vector env; the [2, n] ledger (decisions
    judged, decisions against the contract, per sub-env) they add to, or None when no sub-env has one."""
    envs = getattr(vector_env, "envs", None)
    if not isinstance(envs, list) or not envs:
        return None
    ledger = np.zeros((2, len(envs)), dtype=np.int64)
    probed = False
    for index, top in enumerate(envs):
        parent, env = None, top
        while isinstance(env, gym.Wrapper) and not isinstance(env, gym.wrappers.TimeLimit):
            parent, env = env, env.env
        limit = getattr(env, "_max_episode_steps", None)
        if not isinstance(env, gym.wrappers.TimeLimit) or not isinstance(limit, (int, np.integer)) or limit < 1:
            continue
        decision = TimeLimitDecision(env, limit, ledger, index)
        if parent is None:
            envs[index] = decision
        else:
            parent.env = decision
        probed = True
    return ledger if probed else None


def take_decisions(ledger: np.ndarray | None) -> tuple[int, int]:
    """(decisions judged, decisions against the contract) since the last take; (0, 0) without probes."""
    if ledger is None:
        return 0, 0
    decisions, wrong = (int(v) for v in ledger.sum(1))
    ledger[:] = 0
    return decisions, wrong
