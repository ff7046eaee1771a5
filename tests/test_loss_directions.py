"""Loss directions: which way a loss moves each network output, read from its gradient.

A correct PPO loss can never read below 0 on any term, whatever the batch
(learner/diagnostics.py says why); each sign error a loss can carry reads
below 0 on its own term and leaves the others alone. Hand-worked values: the
value term reads the value coefficient and the entropy term the entropy
coefficient exactly; the policy term reads 1 while no sample is clipped.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_loss import SETTINGS, batch

from rlvitals.learner.diagnostics import loss_directions
from rlvitals.learner.ppo import ppo_loss


def directions(b: dict, loss_fn=ppo_loss, settings=SETTINGS) -> dict[str, float]:
    outputs = {k: b[k].clone().requires_grad_() for k in ("logp", "values", "entropy")}
    loss, _ = loss_fn(outputs["logp"], b["behaviour_logp"], outputs["values"], b["advantages"],
                      b["value_targets"], outputs["entropy"], settings)
    for t in outputs.values():
        t.retain_grad()
    loss.backward()
    out = loss_directions(outputs["logp"], outputs["values"], outputs["entropy"], b["advantages"],
                          b["value_targets"], settings.normalize_advantages)
    return {k.split("_")[0]: float(v) for k, v in out.items()}


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_a_correct_loss_reads_at_or_above_zero_on_every_term(seed, normalize):
    s = dataclasses.replace(SETTINGS, normalize_advantages=normalize)
    d = directions(batch(seed, 64, log_ratio_scale=0.5), settings=s)
    assert d["policy"] >= 0 and d["value"] == pytest.approx(s.value_coef, rel=1e-6)
    assert d["entropy"] == pytest.approx(s.entropy_coef, rel=1e-6)


def test_the_policy_term_reads_one_when_nothing_is_clipped():
    b = batch(0, 32)
    b["logp"] = b["behaviour_logp"].clone()          # ratio 1 everywhere: the surrogate's gradient is -a_i / N
    assert directions(b)["policy"] == pytest.approx(1.0, rel=1e-6)


def _flipped(change):
    def loss(logp, blogp, v, adv, tgt, ent, s):
        return ppo_loss(*change(logp, blogp, v, adv, tgt, ent), s)
    return loss


SIGN_ERRORS = {
    "advantages negated": ("policy", _flipped(lambda lp, b, v, a, t, e: (lp, b, v, -a, t, e))),
    "ratio inverted": ("policy", _flipped(lambda lp, b, v, a, t, e: (b, lp, v, a, t, e))),
    "value loss ascended": ("value", lambda lp, b, v, a, t, e, s: (
        ppo_loss(lp, b, v, a, t, e, s)[0] - 2 * s.value_coef * 0.5 * (v - t).pow(2).mean(), None)),
    "entropy bonus subtracted": ("entropy", _flipped(lambda lp, b, v, a, t, e: (lp, b, v, a, t, -e))),
}


@pytest.mark.parametrize("error", list(SIGN_ERRORS))
def test_each_sign_error_reads_below_zero_on_its_own_term_only(error):
    term, loss_fn = SIGN_ERRORS[error]
    for seed in range(5):
        d = directions(batch(seed, 64, log_ratio_scale=0.1), loss_fn)
        assert d[term] < 0, (error, d)
        assert all(v >= 0 for k, v in d.items() if k != term), (error, d)


# ----------------------------------------------------------- the gradient is this loss's; the record is consistent


def _value_step(net, obs, targets, zero: bool) -> float:
    import torch

    from rlvitals.learner.diagnostics import loss_directions

    params, values = net(obs)
    logp = net.dist.log_prob(params, torch.zeros(len(obs), dtype=torch.long))
    entropy = net.dist.entropy(params)
    for t in (logp, values, entropy):
        t.retain_grad()
    if zero:
        net.zero_grad(set_to_none=False)
    loss, _ = ppo_loss(logp, logp.detach(), values, torch.ones(len(obs)), targets, entropy, SETTINGS)
    loss.backward()
    return float(loss_directions(logp, values, entropy, torch.ones(len(obs)), targets, False,
                                 net.value_bias())["gradient_mismatch"])


def test_gradient_mismatch_is_rounding_when_zeroed_and_order_one_when_gradients_pile_up():
    import gymnasium as gym
    import torch

    from rlvitals.learner.networks import ActorCritic

    env = gym.make("CartPole-v1")
    net = ActorCritic(env.observation_space, env.action_space)
    obs = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        targets = net(obs)[1] + 1.0                    # every value below its target: sum_i dL/dV_i = -sum |dL/dV_i|
    assert _value_step(net, obs, targets, zero=True) < 1e-5
    assert _value_step(net, obs, targets, zero=True) < 1e-5
    assert _value_step(net, obs, targets, zero=False) == pytest.approx(1.0, rel=1e-4)   # last step's gradient kept


def test_the_actors_record_is_consistent_unless_actions_and_log_probabilities_part():
    import torch

    from rlvitals.learner.diagnostics import record_discrepancy
    from rlvitals.learner.networks import Categorical

    dist = Categorical(4)
    g = torch.Generator().manual_seed(1)
    params = torch.randn(16 * 8, 4, generator=g)
    actions, logp = dist.sample(params, g)            # the actor acts on [N, P]; the rollout stacks [T, N, ...]
    params, actions, logp = params.reshape(16, 8, 4), actions.reshape(16, 8), logp.reshape(16, 8)
    valid = torch.ones(16, 8, dtype=torch.bool)
    assert float(record_discrepancy(dist, params, actions, logp, valid)) < 1e-6
    assert float(record_discrepancy(dist, params, torch.roll(actions, 1, 0), logp, valid)) > 0.1
    assert torch.isnan(record_discrepancy(dist, params, actions, logp, torch.zeros_like(valid)))


def test_the_weights_fingerprint_follows_the_parameters_not_the_object():
    import copy

    import gymnasium as gym
    import torch

    from rlvitals.learner.networks import ActorCritic

    env = gym.make("CartPole-v1")
    net = ActorCritic(env.observation_space, env.action_space)
    twin = copy.deepcopy(net)
    twin.load_state_dict(net.state_dict())
    assert twin.weights_checksum() == net.weights_checksum()
    with torch.no_grad():
        next(twin.parameters())[0, 0] += 1e-3           # one weight of thousands
    assert abs(twin.weights_checksum() - net.weights_checksum()) / abs(net.weights_checksum()) > 1e-9
