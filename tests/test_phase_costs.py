"""Each phase's cost against a reference timed in the same process (rlvitals/costs.py): the actor's env step
against a copy of the env as gymnasium builds it, the learner's minibatch step against a copy of its network's
step. The references never touch what the run steps or learns with, and hidden work in either phase is named on
its component."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest
import torch
from diagnose import diagnose
from planted_bugs import BY_BUG

from rlvitals.actors.env_step_cost import EVERY, EnvStepCost
from rlvitals.actors.envs import find_witness
from rlvitals.actors.runner import EnvRunner
from rlvitals.actors.witness import Witness
from rlvitals.costs import ENV_STEP_KEY, actor_cost_ratios
from rlvitals.learner.minibatch_cost import KEY as MINIBATCH_KEY
from rlvitals.learner.networks import ActorCritic
from rlvitals.learner.ppo import PPOLearner, PPOSettings
from rlvitals.telemetry.rules import ENV_STEP_COST_LIMIT, MINIBATCH_COST_LIMIT


def collect(runner: EnvRunner, net: ActorCritic, rollouts: int):
    return [runner.collect(net, 16) for _ in range(rollouts)]


def runner_and_net(env: str = "CartPole-v1", seed: int = 3):
    runner = EnvRunner(env, 4, seed)
    torch.manual_seed(seed)   # the weights come from the global generator: two calls give one network
    net = ActorCritic(runner.obs_space, runner.action_space)
    net.seed(seed)
    return runner, net


def test_the_env_step_reference_steps_a_copy_and_leaves_the_run_as_it_was(monkeypatch):
    measured, net = runner_and_net()
    with monkeypatch.context() as mp:
        mp.setattr(EnvStepCost, "measure", lambda self, between=None: None)
        plain, plain_net = runner_and_net()
        expected = collect(plain, plain_net, EVERY + 2)
    got = collect(measured, net, EVERY + 2)
    # The run's envs and its draws are as if nothing had been timed.
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.obs, b.obs) and torch.equal(a.rewards, b.rewards) and torch.equal(a.actions, b.actions)
    # A measurement puts the global generators back (an env that draws from them changes nothing the run sees).
    measured.env_step_cost.collects = 0
    before = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    measured.env_step_cost.measure()
    assert random.getstate() == before[0] and np.array_equal(np.random.get_state()[1], before[1])
    assert torch.equal(torch.get_rng_state(), before[2])
    copy = measured.env_step_cost.env
    # A copy of its own: gymnasium's env under the project's witness, never the run's env or anything around it.
    assert copy is not None and copy is not measured.env and isinstance(copy, Witness)
    assert copy.env is not find_witness(measured.env).env
    assert len(measured.env_step_cost.timings) == 3   # the first rollout, the EVERY-th after it, the call above
    assert all("env_step_reference" in r.timings and r.timings["env_step_cpu"] > 0 for r in got)
    assert ENV_STEP_KEY in actor_cost_ratios(got[-1])
    measured.close()
    plain.close()


def test_an_env_that_cannot_be_built_twice_gives_no_reference_and_the_run_goes_on():
    runner, net = runner_and_net()

    def refuse():
        raise OSError("the env's port is taken by the run's own env")

    runner.env_step_cost.build = refuse
    rollouts = collect(runner, net, 2)
    assert runner.env_step_cost.broken and all("env_step_reference" not in r.timings for r in rollouts)
    assert ENV_STEP_KEY not in actor_cost_ratios(rollouts[-1])
    runner.close()


def settings() -> PPOSettings:
    return PPOSettings(learning_rate=3e-4, gamma=0.99, gae_lambda=0.95, update_epochs=2, num_minibatches=4,
                       clip_coef=0.2, value_coef=0.5, entropy_coef=0.01, max_grad_norm=0.5,
                       normalize_advantages=True, vtrace_rho_clip=1.0, vtrace_c_clip=1.0)


def test_the_minibatch_reference_leaves_weights_optimizer_and_draws_as_they_were(monkeypatch):
    runner, actor_net = runner_and_net()
    rollouts = collect(runner, actor_net, 3)
    runner.close()

    def learn_all(measure: bool):
        torch.manual_seed(0)
        net = ActorCritic(runner.obs_space, runner.action_space)
        learner = PPOLearner(net, settings(), torch.device("cpu"), seed=5)
        with monkeypatch.context() as mp:
            if not measure:
                mp.setattr(learner.minibatch_cost, "measure", lambda *args, **kwargs: None)
            stats = [learner.learn(r) for r in rollouts]
        return learner, stats

    measured, stats = learn_all(True)
    plain, _ = learn_all(False)
    for a, b in zip(measured.net.parameters(), plain.net.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(measured.generator.get_state(), plain.generator.get_state())
    assert measured.optimizer.state_dict()["state"].keys() == plain.optimizer.state_dict()["state"].keys()
    assert all(MINIBATCH_KEY in s and s[MINIBATCH_KEY] > 0 for s in stats)
    assert measured.minibatch_cost.net is not measured.net


HEALTHY_MAX = {ENV_STEP_KEY: 1.5, MINIBATCH_KEY: 2.2}
"""The largest readings of healthy runs (telemetry/rules.py): a planted fault's readings sit above them throughout."""


@pytest.mark.parametrize("name, rule, key", [
    ("actor_copies_the_batch_for_every_env_pendulum", "RLActorEnvStepOverCost", ENV_STEP_KEY),
    ("learner_recomputes_the_minibatch_forward", "RLLearnerMinibatchOverCost", MINIBATCH_KEY),
])
def test_hidden_work_in_a_phase_is_named_on_its_component(name, rule, key, tmp_path):
    bug = BY_BUG[name]
    found = diagnose(tmp_path / name, bug=bug, budget_s=300)
    assert found.first is not None and (found.first.rule, found.first.component) == (rule, bug.component), \
        found.verdicts
    assert found.first.first_update <= 10
    ratios = [row[key] for row in found.rows if key in row]
    assert ratios and statistics.median(ratios) > HEALTHY_MAX[key]
    assert HEALTHY_MAX[key] < {ENV_STEP_KEY: ENV_STEP_COST_LIMIT, MINIBATCH_KEY: MINIBATCH_COST_LIMIT}[key]
