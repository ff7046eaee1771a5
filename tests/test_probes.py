"""The probe environments are what the pattern table assumes they are, and the checker can say no.

These are env-level facts, checked by stepping each probe through the real env
runner (no training): which observations change, what the terminal observation
is, what the rewards are, where a time limit cuts. The doctor's reasoning
(docs/doctor.md) rests on them. Training the probes is tests/test_doctor.py's job.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlvitals.actors.agents import FixedActionAgent, RandomAgent
from rlvitals.actors.probes import PROBES, REFERENCE_GAMMA, TIME_LIMIT, gamma_env_id, time_limit_env_id
from rlvitals.actors.runner import EnvRunner
from rlvitals.doctor import PROBABILITY_TOLERANCE, VALUE_TOLERANCE, check_probe, probe_config
from rlvitals.doctor.ladder import UNIFORM_TOLERANCE, evaluate

BY_NAME = {p.name: p for p in PROBES}


def rollout_of(env_id: str, steps: int = 64, num_envs: int = 4, agent: str = "random", seed: int = 0):
    runner = EnvRunner(env_id, num_envs, seed)
    try:
        policy = RandomAgent(runner.action_space, seed) if agent == "random" else \
            FixedActionAgent(runner.action_space, int(agent))
        return runner.collect(policy, steps)
    finally:
        runner.close()


def episodes(rollout):
    """Per env: list of episodes, each a list of (obs acted on, reward, obs returned, terminated, truncated)."""
    out = []
    obs, valid = rollout.obs[..., 0].numpy(), rollout.valid.numpy()
    for i in range(rollout.num_envs):
        eps, current = [], []
        for t in range(rollout.num_steps):
            if not valid[t, i]:
                continue
            current.append((obs[t, i], float(rollout.rewards[t, i]), obs[t + 1, i],
                            bool(rollout.terminated[t, i]), bool(rollout.truncated[t, i])))
            if rollout.terminated[t, i] or rollout.truncated[t, i]:
                eps.append(current)
                current = []
        out.append(eps)
    return out


def test_probe_specs_are_decisive():
    assert [p.name for p in PROBES] == [f"P{k}" for k in range(1, 10)]
    for probe in PROBES:
        assert len(probe.observations) == len(probe.best_actions)
        assert len(probe.values) in (0, len(probe.observations))
        assert probe.values or probe.uniform_policy, f"{probe.name} checks nothing"
        assert probe.implicates
    # probe 2's first value is gamma: the reference gamma must be far enough from 1 for a wrong one to show
    assert 1.0 - probe_config(PROBES[1].env_id, 0, "unused").gamma > VALUE_TOLERANCE
    assert probe_config("x", 0, "unused").anneal_lr is False


@pytest.mark.parametrize("name", ["P1", "P4", "P7", "P8", "P9"])
def test_constant_observation_probes_only_ever_show_zero(name):
    rollout = rollout_of(BY_NAME[name].env_id)
    assert rollout.obs.abs().max() == 0


@pytest.mark.parametrize("name, fresh", [("P3", True), ("P5", True), ("P6", False)])
def test_terminal_observation_is_fresh_or_held(name, fresh):
    """P3 and P5 draw the terminal observation afresh; P6 returns the observation it held."""
    eps = [e for env in episodes(rollout_of(BY_NAME[name].env_id, steps=200)) for e in env]
    assert len(eps) > 300 and all(len(e) == 1 and e[0][3] for e in eps)
    same = np.mean([e[0][0] == e[0][2] for e in eps])
    if fresh:
        assert 0.35 < same < 0.65, same      # independent signs: equal about half the time
    else:
        assert same == 1.0
    assert {float(e[0][0]) for e in eps} == {-1.0, 1.0}


def test_observation_reward_probes_pay_the_observation():
    for name in ("P3", "P6"):
        for env in episodes(rollout_of(BY_NAME[name].env_id)):
            for (o, r, *_), in env:
                assert r == o


@pytest.mark.parametrize("action, reward", [(0, -1.0), (1, 1.0)])
def test_action_probe_rewards(action, reward):
    rollout = rollout_of(BY_NAME["P4"].env_id, agent=str(action))
    assert rollout.rewards[rollout.valid].eq(reward).all()
    # P5 pays +1 only where the action matches the sign of the observation
    for env in episodes(rollout_of(BY_NAME["P5"].env_id, agent=str(action))):
        for (o, r, *_), in env:
            assert r == (1.0 if (action == 1) == (o > 0) else -1.0)


def test_indifferent_probe_pays_at_random_whatever_the_action():
    by_action = {}
    for action in (0, 1):
        rollout = rollout_of(BY_NAME["P8"].env_id, steps=400, agent=str(action))
        by_action[action] = rollout.rewards[rollout.valid].numpy()
    for rewards in by_action.values():
        assert set(np.unique(rewards)) == {-1.0, 1.0}
        assert abs(rewards.mean()) < 0.1


def test_discount_probe_pays_at_the_end_of_two_steps():
    for env in episodes(rollout_of(BY_NAME["P2"].env_id)):
        for ep in env:
            assert [(o, r, term) for o, r, _, term, _ in ep] == [(0.0, 0.0, False), (1.0, 1.0, True)]


@pytest.mark.parametrize("gamma", [REFERENCE_GAMMA, 0.99, 0.0])
def test_time_limit_probe_is_truncated_never_terminated_and_pays_one_minus_gamma(gamma):
    env_id = time_limit_env_id(gamma)
    assert gym.spec(env_id).max_episode_steps == TIME_LIMIT
    eps = [e for env in episodes(rollout_of(env_id, steps=40)) for e in env]
    assert eps and all(len(e) == TIME_LIMIT for e in eps)
    for ep in eps:
        assert not any(step[3] for step in ep)                 # never terminated
        assert [step[4] for step in ep] == [False] * (TIME_LIMIT - 1) + [True]
        assert all(step[1] == pytest.approx(1.0 - gamma) for step in ep)
    # V = sum_k gamma^k (1 - gamma) = 1; cut at the limit without bootstrap it would be far less
    assert sum(gamma ** k * (1 - gamma) for k in range(10_000)) == pytest.approx(1.0, abs=1e-6)
    assert time_limit_env_id(gamma) == env_id                  # registered once


@pytest.mark.parametrize("gamma", [REFERENCE_GAMMA, 0.99])
def test_endless_probe_never_ends_and_pays_one_minus_gamma(gamma):
    env_id = gamma_env_id(BY_NAME["P9"].env_id, gamma)
    assert gym.spec(env_id).max_episode_steps is None
    rollout = rollout_of(env_id, steps=300)
    assert rollout.valid.all() and not rollout.terminated.any() and not rollout.truncated.any()
    assert torch.allclose(rollout.rewards, torch.full_like(rollout.rewards, 1.0 - gamma))


class FixedNet(torch.nn.Module):
    """A stand-in network with chosen outputs: (logits, values) per observation in probe order."""

    def __init__(self, probe, values, probs):
        super().__init__()
        self.table = {o: (v, p) for o, v, p in zip(probe.observations, values, probs, strict=True)}

    def forward(self, obs):
        rows = [self.table[float(o)] for o in obs[:, 0]]
        values = torch.tensor([v for v, _ in rows])
        logits = torch.log(torch.tensor([p for _, p in rows]).clamp_min(1e-12))
        return logits, values


def test_checker_accepts_exact_answers_and_rejects_wrong_ones():
    p2 = BY_NAME["P2"]
    exact = FixedNet(p2, [REFERENCE_GAMMA, 1.0], [[1.0], [1.0]])
    assert check_probe(p2, exact, REFERENCE_GAMMA)[0]
    assert not check_probe(p2, exact, 1.0)[0]                  # gamma ignored: V(first) would be 1
    off = FixedNet(p2, [REFERENCE_GAMMA + 2 * VALUE_TOLERANCE, 1.0], [[1.0], [1.0]])
    ok, details = check_probe(p2, off, REFERENCE_GAMMA)
    assert not ok and "<-- wrong" in details[0]

    p5 = BY_NAME["P5"]
    good = FixedNet(p5, [1.0, 1.0], [[1.0, 0.0], [0.0, 1.0]])
    assert check_probe(p5, good, REFERENCE_GAMMA)[0]
    flipped = dataclasses.replace(p5, best_actions=(1, 0))
    assert not check_probe(flipped, good, REFERENCE_GAMMA)[0]
    # V must be the value of the policy learned: pi(correct) = 0.97 earns 0.94 on average, not 1
    hedged = FixedNet(p5, [0.94, 0.94], [[0.97, 0.03], [0.03, 0.97]])
    assert check_probe(p5, hedged, REFERENCE_GAMMA)[0]
    unsure = FixedNet(p5, [1.0, 1.0], [[1.0 - 2 * PROBABILITY_TOLERANCE, 2 * PROBABILITY_TOLERANCE], [0.0, 1.0]])
    assert not check_probe(p5, unsure, REFERENCE_GAMMA)[0]

    p8 = BY_NAME["P8"]
    assert check_probe(p8, FixedNet(p8, [0.0], [[0.5, 0.5]]), REFERENCE_GAMMA)[0]
    lean = 0.5 + UNIFORM_TOLERANCE + 0.01
    checks, _, _ = evaluate(p8, FixedNet(p8, [0.0], [[1 - lean, lean]]), REFERENCE_GAMMA)
    assert checks == {"pi": False}


def test_reward_check_and_frozen_value_are_told_apart():
    p1 = BY_NAME["P1"]
    zero = FixedNet(p1, [0.0], [[1.0]])
    checks, frozen, details = evaluate(p1, zero, REFERENCE_GAMMA, initial=zero)
    assert checks == {"V": False, "r": False} and frozen and "no reward reached the learner" in details[-1]
    half = FixedNet(p1, [0.5], [[1.0]])
    checks, frozen, _ = evaluate(p1, half, REFERENCE_GAMMA, initial=zero)
    assert checks == {"V": False, "r": True} and not frozen
    assert evaluate(p1, FixedNet(p1, [1.0], [[1.0]]), REFERENCE_GAMMA, initial=zero)[0] == {"V": True, "r": True}
