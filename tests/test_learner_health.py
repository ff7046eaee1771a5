"""The learner's health statistics (issue 11) read what they claim on real batches.

- `logp_discrepancy`: with the weights that acted, the learner's log pi(a|x) equals the
  actor's log mu(a|x) (CPU: bit-exact for batched envs, within LOGP_TOLERANCE always);
  observations stored one step off show as plain > 0 with `logp_discrepancy_shifted` ~ 0;
  learner-only preprocessing shows as both > 0; a stale batch reads NaN.
- `grad_norm_policy` / `grad_norm_value`: a head that gets no gradient reads exactly 0.
- `reward_scale`, `value_target_scale`, and `residual_variance` undefined on flat targets.
Bugs are planted here, on the rollout or the network, never in the product code.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlvitals.actors.runner import EnvRunner
from rlvitals.learner import diagnostics as diag
from rlvitals.learner.invariants import observation_pairing
from rlvitals.learner.networks import ActorCritic
from rlvitals.learner.ppo import PPOLearner, PPOSettings

CPU = torch.device("cpu")
# float32 log-softmax on CPU: 0 when the actor's and the learner's matmuls take the same
# kernel (several envs); one rounding of a log-prob (1.2e-7 measured) when a single env
# makes the actor's a matrix-vector product. GPU TF32 or bfloat16 need ~1e-3 to 1e-2.
LOGP_TOLERANCE = 1e-6
SETTINGS = PPOSettings(learning_rate=2.5e-3, gamma=0.99, gae_lambda=0.95, update_epochs=2, num_minibatches=4,
                       clip_coef=0.2, value_coef=0.5, entropy_coef=0.0, max_grad_norm=0.5,
                       normalize_advantages=True, vtrace_rho_clip=1.0, vtrace_c_clip=1.0)


@pytest.fixture
def cartpole():
    """(runner, net, learner) on CartPole-v1, 8 envs, a decisive policy (so a wrong x shows in log pi)."""
    torch.manual_seed(0)
    runner = EnvRunner("CartPole-v1", 8, 0)
    net = ActorCritic(runner.obs_space, runner.action_space)
    net.seed(0)
    with torch.no_grad():
        net.policy_out.weight.mul_(100.0)
    learner = PPOLearner(net, SETTINGS, CPU, 0, debug=True)
    yield runner, net, learner
    runner.close()


def with_obs(rollout, obs):
    return dataclasses.replace(rollout, obs=obs)


def test_healthy_batches_are_consistent(cartpole):
    runner, net, learner = cartpole
    for _ in range(2):
        stats = learner.learn(runner.collect(net, 32))
        assert stats["staleness"] == 0
        assert 0 <= stats["logp_discrepancy"] <= LOGP_TOLERANCE
        assert stats["logp_discrepancy_shifted"] > 1e-2, "neighbouring observations give other log-probs"


def test_single_env_batch_is_consistent_within_tolerance():
    torch.manual_seed(1)
    runner = EnvRunner("Pendulum-v1", 1, 1)
    try:
        net = ActorCritic(runner.obs_space, runner.action_space)
        learner = PPOLearner(net, SETTINGS, CPU, 1)
        for _ in range(2):
            stats = learner.learn(runner.collect(net, 64))
            assert 0 <= stats["logp_discrepancy"] <= LOGP_TOLERANCE
    finally:
        runner.close()


@pytest.mark.parametrize("direction", ["late", "early"])
def test_observations_one_step_off_their_actions(cartpole, direction):
    """obs[t] holding x_{t+1} (stored after the step) or x_{t-1}: the shifted discrepancy finds the pairing."""
    runner, net, learner = cartpole
    rollout = runner.collect(net, 64)
    obs = rollout.obs
    shifted = torch.cat([obs[1:], obs[-1:]]) if direction == "late" else torch.cat([obs[:1], obs[:-1]])
    stats = learner.learn(with_obs(rollout, shifted))
    assert stats["logp_discrepancy"] > 1e-2
    assert stats["logp_discrepancy_shifted"] <= LOGP_TOLERANCE


def test_an_actor_acting_on_the_previous_observation_is_the_actors_invariant(cartpole, monkeypatch):
    """The rollout stores the right observations, but the policy was called on the previous step's: the shift
    explains the disagreement, so it counts against the actor's invariant, not the learner's reading."""
    from planted_bugs import BY_BUG

    runner, net, learner = cartpole
    BY_BUG["actor_acts_on_the_previous_observation"].apply(monkeypatch)
    stats = learner.learn(runner.collect(net, 64))
    split = observation_pairing(stats["logp_discrepancy"], stats["logp_discrepancy_shifted"])
    assert split["inv_acted_on_stored_observation"] > 1e-2 and split["inv_learner_sees_actor_data"] == 0.0


def test_the_split_of_the_discrepancy_by_hand():
    assert observation_pairing(0.5, 0.001) == {"inv_learner_sees_actor_data": 0.0,
                                               "inv_acted_on_stored_observation": 0.5}
    assert observation_pairing(0.5, 0.3) == {"inv_learner_sees_actor_data": 0.5, "inv_acted_on_stored_observation": 0.0}
    assert observation_pairing(0.5, math.nan)["inv_learner_sees_actor_data"] == 0.5    # no neighbour: the reading
    assert all(math.isnan(v) for v in observation_pairing(math.nan, math.nan).values())   # not measured


def test_learner_only_preprocessing_shows_in_both(cartpole):
    runner, net, learner = cartpole
    rollout = runner.collect(net, 64)
    stats = learner.learn(with_obs(rollout, rollout.obs * 1.5))   # e.g. a scaling the actor never applied
    split = observation_pairing(stats["logp_discrepancy"], stats["logp_discrepancy_shifted"])
    assert split["inv_learner_sees_actor_data"] > 1e-2 and split["inv_acted_on_stored_observation"] == 0.0
    assert stats["logp_discrepancy"] > 1e-2
    assert stats["logp_discrepancy_shifted"] > 1e-2


def test_stale_batch_reads_undefined(cartpole):
    runner, net, learner = cartpole
    first, second = runner.collect(net, 32), runner.collect(net, 32)
    learner.learn(first)
    stats = learner.learn(second)   # collected before the first update: stale
    assert stats["staleness"] > 0
    assert math.isnan(stats["logp_discrepancy"]) and math.isnan(stats["logp_discrepancy_shifted"])


def test_discrepancy_edge_cases():
    from rlvitals.learner.networks import Categorical

    dist = Categorical(3)
    g = torch.Generator().manual_seed(0)
    params = torch.randn(2, 4, 3, generator=g)            # T = 1: obs[0], obs[1]
    actions = torch.randint(0, 3, (1, 4), generator=g)
    logp = dist.log_prob(params[:1], actions)
    valid = torch.ones(1, 4, dtype=torch.bool)
    plain, shifted = diag.logp_discrepancy(dist, params, actions, logp, valid)
    assert plain == 0
    # Only x_{t+1} exists for T = 1: the shifted value is that side's.
    assert shifted == (dist.log_prob(params[1:], actions) - logp).abs().max()
    plain, shifted = diag.logp_discrepancy(dist, params, actions, logp, torch.zeros_like(valid))
    assert math.isnan(plain) and math.isnan(shifted)


def test_detached_value_head_reads_exactly_zero(cartpole):
    runner, net, learner = cartpole
    value = net.value
    net.value = lambda obs: value(obs).detach()          # planted: no gradient reaches the value net
    stats = learner.learn(runner.collect(net, 64))
    assert stats["grad_norm_value"] == 0.0
    assert stats["grad_norm_policy"] > 0
    # Layers with no gradient at all export 0, not a missing key.
    value_layers = [k for k in stats if k.startswith("layer_gradient_rms/value_")]
    assert value_layers and all(stats[k] == 0.0 for k in value_layers)
    assert all(stats[k] > 0 for k in stats if k.startswith("layer_gradient_rms/policy_"))


def test_head_gradient_norms_are_the_heads_own_gradients(cartpole):
    """One minibatch, one epoch: grad_norm_{head} is the norm of that head's gradient before clipping."""
    runner, net, learner = cartpole
    learner.s = dataclasses.replace(SETTINGS, update_epochs=1, num_minibatches=1)
    seen = {}
    clip = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm):
        params = list(params)
        if not seen:   # the learner's one step; later calls clip the minibatch cost reference's copy
            for head, ps in net.heads().items():
                seen[head] = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ps])).item()
        return clip(params, max_norm)

    torch.nn.utils.clip_grad_norm_ = spy
    try:
        stats = learner.learn(runner.collect(net, 32))
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
    assert stats["grad_norm_policy"] == pytest.approx(seen["policy"], rel=1e-6)
    assert stats["grad_norm_value"] == pytest.approx(seen["value"], rel=1e-6)
    assert stats["grad_norm_value"] > SETTINGS.max_grad_norm   # really before clipping


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_reward_and_value_target_scale_on_healthy_runs(env_id):
    torch.manual_seed(2)
    runner = EnvRunner(env_id, 8, 2)
    try:
        net = ActorCritic(runner.obs_space, runner.action_space)
        learner = PPOLearner(net, dataclasses.replace(SETTINGS, update_epochs=1), CPU, 2)
        scales, seen_max = [], 0.0
        for _ in range(5):
            rollout = runner.collect(net, 64)
            seen_max = max(seen_max, rollout.rewards[rollout.valid].abs().max().item())
            stats = learner.learn(rollout)
            assert stats["reward_scale"] == pytest.approx(seen_max)
            scales.append(stats["value_target_scale"])
        assert all(0 < s <= 1.1 for s in scales), scales
        if env_id == "CartPole-v1":
            assert stats["reward_scale"] == 1.0
    finally:
        runner.close()


def test_value_target_scale_and_flat_target_threshold_by_hand():
    # gamma = 0.9: bound = r_max / (1 - gamma) = 2 / 0.1 = 20 with r_max = 2 (|-2| on a valid step;
    # the 50 on the reset transition does not count). max|target| over valid steps = 5 -> 5/20 = 0.25.
    # No episode ends: horizon 1 / (1 - gamma) = 10, flat below 1% of 2 * 10 = 0.2.
    learner = PPOLearner(ActorCritic(*_spaces()), dataclasses.replace(SETTINGS, gamma=0.9), CPU)
    rewards = torch.tensor([[1.0, -2.0], [50.0, 0.5]])
    targets = torch.tensor([[5.0, -3.0], [100.0, 1.0]])
    valid = torch.tensor([[True, True], [False, True]])
    no_end = torch.zeros(2, 2, dtype=torch.bool)
    stats = learner._scale_stats(rewards, targets, valid, no_end)
    assert stats["reward_scale"].item() == 2.0
    assert stats["value_target_scale"].item() == pytest.approx(0.25)
    assert stats["min_target_std"].item() == pytest.approx(0.2)
    # One episode ends in 3 valid steps: horizon min(10, 3) = 3, flat below 1% of 2 * 3 = 0.06.
    ends = torch.tensor([[True, False], [False, False]])
    assert learner._scale_stats(rewards, targets, valid, ends)["min_target_std"].item() == pytest.approx(0.06)
    # Running max: a smaller batch keeps 2; NaN rewards do not stick.
    one = torch.ones(1, 2, dtype=torch.bool)
    stats = learner._scale_stats(torch.tensor([[0.1, float("nan")]]), torch.zeros(1, 2), one, ~one)
    assert stats["reward_scale"].item() == 2.0
    # Nothing rewarded yet: the ratio is undefined.
    fresh = PPOLearner(ActorCritic(*_spaces()), SETTINGS, CPU)
    assert math.isnan(fresh._scale_stats(torch.zeros(2, 2), targets, valid, no_end)["value_target_scale"].item())
    # gamma = 1: no bound on |v|; the threshold comes from the episode length alone.
    undiscounted = PPOLearner(ActorCritic(*_spaces()), dataclasses.replace(SETTINGS, gamma=1.0), CPU)
    stats = undiscounted._scale_stats(rewards, targets, valid, ends)
    assert math.isnan(stats["value_target_scale"].item())
    assert stats["min_target_std"].item() == pytest.approx(0.06)
    assert undiscounted._scale_stats(rewards, targets, valid, no_end)["min_target_std"].item() == 0.0


def test_reward_scale_survives_a_checkpoint_round_trip(tmp_path):
    learner = PPOLearner(ActorCritic(*_spaces()), SETTINGS, CPU)
    learner._scale_stats(torch.tensor([[3.0]]), torch.zeros(1, 1), torch.ones(1, 1, dtype=bool),
                         torch.zeros(1, 1, dtype=bool))
    path = tmp_path / "extra.pt"
    torch.save(learner.extra_state(), path)
    other = PPOLearner(ActorCritic(*_spaces()), SETTINGS, CPU)
    other.load_extra_state(torch.load(path, weights_only=True))
    assert other.reward_scale.item() == 3.0


def test_residual_variance_is_undefined_for_flat_targets():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(64, 4, generator=g)
    mask = torch.ones(64, 4, dtype=torch.bool)
    flat = 100 + 0.3 * torch.randn(64, 4, generator=g)      # std 0.3 < 1% of 1 / (1 - 0.99) = 1
    assert math.isnan(diag.residual_variance(flat, values, mask, min_std=1.0))
    assert math.isfinite(diag.residual_variance(flat, values, mask))
    spread = 100 + 5 * torch.randn(64, 4, generator=g)
    assert math.isfinite(diag.residual_variance(spread, values, mask, min_std=1.0))


def _spaces():
    import gymnasium as gym
    import numpy as np

    return gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Discrete(2)
