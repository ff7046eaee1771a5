"""`rlvitals doctor --env module:EnvId`: a user's env, stepped through the actors by the probe agents.

The random agent and the fixed-action agent act through the same env runner
as training, with learning off, so whatever they see the learner would see.
Every finding is a Verdict with component `env`:

- observations inside the declared observation space, and finite;
- rewards finite;
- episodes that end (terminated or truncated) within a bound;
- seeded resets that reproduce: the same seed gives the same first observation
  and, under the same actions, the same trajectory;
- resets that restore: an episode played after an autoreset equals its replay on a fresh instance from the
  same generator state and actions (the witness's reset replay, actors/reset_replay.py), and the TimeLimit's
  decisions follow the steps since the reset (actors/time_limit.py);
- steps that return: one that blocks longer than the step timeout (steplimit.py) ends the check.
"""

from __future__ import annotations

import os
import sys
import time

import gymnasium as gym
import numpy as np

from rlvitals.actors.agents import RandomAgent, fixed_agent
from rlvitals.telemetry.verdicts import Verdict

from .steplimit import DEFAULT_STEP_TIMEOUT, StepBlocked, step_limit

DEFAULT_EPISODE_BOUND = 10_000
"""Steps an episode may last when the env registers no time limit of its own."""
NUM_ENVS = 2
CHUNK = 256
"""Steps per collected rollout."""
REPLAY_STEPS = 300
"""Steps compared between two runs with the same seed."""


def episode_bound(env_id: str, override: int | None, env_kwargs: dict | None = None) -> int:
    """The step count within which every episode must end: the flag, the env's time limit, or the default."""
    if override is not None:
        return override
    limit = (env_kwargs or {}).get("max_episode_steps") or gym.spec(env_id).max_episode_steps
    return int(limit) if limit else DEFAULT_EPISODE_BOUND


def agents(action_space: gym.Space, seed: int) -> list[tuple[str, object, object]]:
    """(name, agent, a factory for a fresh identical agent) for each probe agent that fits the action space."""
    out = [("random agent", RandomAgent(action_space, seed), lambda: RandomAgent(action_space, seed))]
    out.append(("fixed-action agent", fixed_agent(action_space), lambda: fixed_agent(action_space)))
    return out


class _Findings:
    """The first occurrence of each kind of problem, as verdicts."""

    def __init__(self, env_id: str, started: float):
        self.env_id, self.started = env_id, started
        self.verdicts: dict[str, Verdict] = {}

    def add(self, rule: str, severity: str, message: str) -> None:
        if rule not in self.verdicts:
            self.verdicts[rule] = Verdict(rule, severity, "env", round(time.perf_counter() - self.started, 3),
                                          None, f"env {self.env_id!r}: {message}")


def _space_violation(space: gym.Space, obs: np.ndarray) -> tuple[str, int] | None:
    """(what is wrong, index of the first bad observation) for a batch of observations [B, *shape]."""
    flat = obs.reshape(obs.shape[0], -1)
    if obs.dtype.kind == "f":
        bad = ~np.isfinite(flat).all(axis=1)
        if bad.any():
            i = int(bad.argmax())
            return f"non-finite observation {_show(flat[i])}", i
    if isinstance(space, gym.spaces.Box):
        low = np.broadcast_to(space.low, space.shape).reshape(-1).astype(obs.dtype)
        high = np.broadcast_to(space.high, space.shape).reshape(-1).astype(obs.dtype)
        bad = ((flat < low) | (flat > high)).any(axis=1)
        if bad.any():
            i = int(bad.argmax())
            j = int(((flat[i] < low) | (flat[i] > high)).argmax())
            return (f"observation {_show(flat[i])} outside the declared space: element {j} is {flat[i, j]:g}, "
                    f"bounds [{low[j]:g}, {high[j]:g}]"), i
    elif isinstance(space, gym.spaces.Discrete):
        values = flat[:, 0]
        bad = (values != np.round(values)) | (values < space.start) | (values >= space.start + space.n)
        if bad.any():
            i = int(bad.argmax())
            return (f"observation {values[i]:g} outside the declared space Discrete({space.n}, "
                    f"start={space.start})"), i
    return None


def _show(row: np.ndarray) -> str:
    items = ", ".join(f"{x:g}" for x in row[:6])
    return f"[{items}{', ...' if row.size > 6 else ''}]"


class _Witnessed:
    """What the witness below the env judged over a walk: replays of episodes after an autoreset on a fresh instance
    (actors/reset_replay.py) and the TimeLimit's decisions (actors/time_limit.py)."""

    def __init__(self):
        self.replays = self.replays_differ = self.limit_decisions = self.limit_wrong = 0

    def add(self, rollout) -> None:
        for record in rollout.witness:
            self.replays += record.reset_replays
            self.replays_differ += record.reset_replays_differ
            self.limit_decisions += record.limit_decisions
            self.limit_wrong += record.limit_wrong

    def report(self, name: str, findings: _Findings) -> None:
        if self.replays_differ:
            findings.add("doctor-env-reset-does-not-restore", "critical",
                         f"with the {name}, {self.replays_differ} of {self.replays} episodes played after an "
                         "autoreset differ from the same episode replayed on a fresh instance (the same generator "
                         "state from reset, the same actions): reset() leaves state from earlier episodes (a step "
                         "counter, something used up, a cached value); it must restore everything an episode uses")
        if self.limit_wrong:
            findings.add("doctor-env-time-limit-broken", "critical",
                         f"with the {name}, {self.limit_wrong} of {self.limit_decisions} time-limit decisions did "
                         "not follow the steps since the episode's reset (truncated before the limit, or not at "
                         "it): the TimeLimit's step count must start again at every reset")


def _walk(runner, agent, name: str, bound: int, findings: _Findings) -> None:
    """Step until every env has finished two episodes (the second starts at an autoreset, where state carried
    across reset shows) or the bound has passed with an episode unfinished, checking what comes back."""
    from rlvitals.actors.runner import EnvStepError

    ended = np.zeros(runner.num_envs, dtype=bool)
    episodes = np.zeros(runner.num_envs, dtype=np.int64)
    since_start = np.zeros(runner.num_envs, dtype=np.int64)
    longest = np.zeros(runner.num_envs, dtype=np.int64)
    witnessed = _Witnessed()
    steps = 0
    while (episodes < 2).any() and (steps <= bound or ended.all()) and steps <= 2 * bound + CHUNK:
        try:
            rollout = runner.collect(agent, CHUNK)
        except EnvStepError as exc:
            findings.add("doctor-env-raised", "critical", f"with the {name}: {exc}")
            return
        witnessed.add(rollout)
        obs = rollout.obs.numpy()
        problem = _space_violation(runner.obs_space, obs.reshape(-1, *obs.shape[2:]))
        if problem is not None:
            what, index = problem
            t, i = divmod(index, runner.num_envs)
            rule = "doctor-env-observation-not-finite" if what.startswith("non-finite") else \
                "doctor-env-observation-outside-space"
            findings.add(rule, "critical", f"with the {name}, env {i} at step {steps + t}: {what}")
        rewards = rollout.rewards.numpy()
        valid = rollout.valid.numpy()
        bad = valid & ~np.isfinite(rewards)
        if bad.any():
            t, i = (int(x[0]) for x in np.nonzero(bad))
            findings.add("doctor-env-reward-not-finite", "critical",
                         f"with the {name}, env {i} at step {steps + t}: reward {rewards[t, i]:g}")
        done = (rollout.terminated.numpy() | rollout.truncated.numpy()) & valid
        for t in range(done.shape[0]):
            since_start += valid[t]
            longest = np.maximum(longest, since_start)
            ended |= done[t]
            episodes += done[t]
            since_start[done[t]] = 0
        steps += CHUNK
    witnessed.report(name, findings)
    if not ended.all():
        findings.add("doctor-env-episode-never-ends", "critical",
                     f"with the {name}, {int((~ended).sum())} of {runner.num_envs} episodes had not ended "
                     f"(terminated or truncated) after {int(longest.max())} steps; the bound is {bound} steps "
                     "(the env's time limit, or --max-episode-steps): give it a time limit or a terminal state")


def _replay(env_id: str, seed: int, make_agent, name: str, findings: _Findings, env_kwargs: dict) -> None:
    """Two runs from the same seed under the same actions must be identical."""
    from rlvitals.actors.runner import EnvRunner, EnvStepError

    runs = []
    for _ in range(2):
        try:
            runner = EnvRunner(env_id, NUM_ENVS, seed, env_kwargs=env_kwargs)
        except EnvStepError:
            return  # reported by the walk
        try:
            first = runner.obs.copy()
            rollout = runner.collect(make_agent(), REPLAY_STEPS)
        except EnvStepError:
            return
        finally:
            runner.close()
        runs.append((first, rollout))
    (first_a, a), (first_b, b) = runs
    if not np.array_equal(first_a, first_b, equal_nan=True):
        findings.add("doctor-env-seeding-not-reproducible", "warning",
                     f"reset(seed={seed}) twice gave different first observations "
                     f"{_show(first_a.reshape(NUM_ENVS, -1)[0])} and {_show(first_b.reshape(NUM_ENVS, -1)[0])}: "
                     "the env must draw its randomness from self.np_random, seeded by reset(seed=...)")
        return
    for field in ("obs", "rewards", "terminated", "truncated"):
        x, y = getattr(a, field).numpy(), getattr(b, field).numpy()
        differ = x != y
        if x.dtype.kind == "f":
            differ &= ~(np.isnan(x) & np.isnan(y))
        if differ.any():
            t = int(np.nonzero(differ)[0][0])
            findings.add("doctor-env-seeding-not-reproducible", "warning",
                         f"two runs from seed {seed} with the {name} first differ in {field} at step {t}: "
                         "the env must draw its randomness from self.np_random, seeded by reset(seed=...)")
            return


def check_env(env_id: str, seed: int = 0, max_episode_steps: int | None = None,
              env_kwargs: dict | None = None,
              step_timeout: float = DEFAULT_STEP_TIMEOUT) -> tuple[list[Verdict], list[str]]:
    """(verdicts, human lines) for a user's env id (already resolved: a registered gymnasium id), made with
    `env_kwargs` as training would make it; a step that blocks past `step_timeout` seconds ends the check."""
    from rlvitals.actors.envs import EnvError
    from rlvitals.actors.runner import EnvRunner, EnvStepError

    started = time.perf_counter()
    findings = _Findings(env_id, started)
    env_kwargs = dict(env_kwargs or {})
    bound = episode_bound(env_id, max_episode_steps, env_kwargs)
    try:
        runner = EnvRunner(env_id, NUM_ENVS, seed, env_kwargs=env_kwargs)
    except (EnvError, EnvStepError) as exc:
        findings.add("doctor-env-unusable", "critical", str(exc))
        return list(findings.verdicts.values()), [f"FAIL  {env_id}: {exc}"]
    try:
        space = runner.action_space
        made = agents(space, seed)
    finally:
        runner.close()
    with step_limit(step_timeout, on_stuck=lambda seconds: _give_up(env_id, seconds)):
        for name, agent, make_agent in made:
            try:
                runner = EnvRunner(env_id, NUM_ENVS, seed, env_kwargs=env_kwargs)
                try:
                    _walk(runner, agent, name, bound, findings)
                finally:
                    runner.close()
                _replay(env_id, seed, make_agent, name, findings, env_kwargs)
            except StepBlocked as exc:  # it would block again: the other agents' checks would only wait too
                findings.add("doctor-env-step-blocked", "critical",
                             f"with the {name}, a step blocked for {exc.seconds:.0f} s, beyond the step timeout of "
                             f"{step_timeout:g} s (--step-timeout); step() must return: look for a call that waits "
                             "(a socket, a lock, a subprocess, a sleep), or raise the timeout for a slow simulator")
                break
    verdicts = list(findings.verdicts.values())
    lines = [f"{'FAIL' if verdicts else 'PASS'}  env {env_id}: observations in space and finite, rewards finite, "
             f"episodes end within {bound} steps, seeded resets reproduce, resets restore, steps return within "
             f"{step_timeout:g} s "
             f"({time.perf_counter() - started:.1f}s, {', '.join(n for n, _, _ in made)})"]
    lines += [f"      {v.rule}: {v.message}" for v in verdicts]
    return verdicts, lines


def _give_up(env_id: str, seconds: float) -> None:
    """A step stuck outside Python (the timeout's signal never handled): say so in one line and end the process."""
    print(f"rlvitals: env {env_id!r}: a step has blocked for {seconds:.0f} s and cannot be interrupted (it is stuck "
          "outside Python); the doctor ends here (finding doctor-env-step-blocked)", file=sys.stderr, flush=True)
    os._exit(1)
