"""The PPO loss and the action distributions against independent references.

`ppo_loss` is a pure function of tensors: it is checked against the PPO paper's
objective (Schulman et al., 2017, eq. 7 and 9) written per sample in plain
Python floats, and its gradient against the one derived by hand. The action
distributions' log-probabilities, entropies and KL divergences are checked
against `torch.distributions`.
"""

from __future__ import annotations

import dataclasses
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import distributions as D

from rlvitals.learner.networks import Categorical, DiagGaussian
from rlvitals.learner.ppo import PPOSettings, ppo_loss

F64 = torch.float64

SETTINGS = PPOSettings(learning_rate=1e-3, gamma=0.99, gae_lambda=0.95, update_epochs=1, num_minibatches=1,
                       clip_coef=0.2, value_coef=0.5, entropy_coef=0.01, max_grad_norm=0.5,
                       normalize_advantages=False, vtrace_rho_clip=1.0, vtrace_c_clip=1.0)


def batch(seed: int, B: int, log_ratio_scale: float = 0.3) -> dict:
    g = torch.Generator().manual_seed(seed)
    behaviour_logp = -torch.rand(B, generator=g, dtype=F64) * 3
    return dict(logp=behaviour_logp + log_ratio_scale * torch.randn(B, generator=g, dtype=F64),
                behaviour_logp=behaviour_logp,
                values=torch.randn(B, generator=g, dtype=F64),
                advantages=torch.randn(B, generator=g, dtype=F64),
                value_targets=torch.randn(B, generator=g, dtype=F64),
                entropy=torch.rand(B, generator=g, dtype=F64))


# --------------------------------------------------------------------------
# Reference: the paper's objective, one sample at a time.
# --------------------------------------------------------------------------

def ref_ppo_loss(logp, behaviour_logp, values, advantages, value_targets, entropy, s: PPOSettings) -> dict:
    """L = -1/B sum_i min(r_i A_i, clip(r_i, 1-eps, 1+eps) A_i)
           + c_v 1/B sum_i 1/2 (V_i - V^targ_i)^2 - c_H 1/B sum_i H_i,     r_i = exp(logp_i - mu_logp_i)
    with A normalised to zero mean and unit (n-1) std per minibatch when asked."""
    lp, blp, v, adv, tgt, ent = (x.tolist() for x in (logp, behaviour_logp, values, advantages,
                                                       value_targets, entropy))
    B, eps = len(lp), s.clip_coef
    if s.normalize_advantages and B > 1:
        mean = sum(adv) / B
        std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (B - 1))
        adv = [(a - mean) / (std + 1e-8) for a in adv]
    policy = value = ent_sum = clipped = 0.0
    for i in range(B):
        r = math.exp(lp[i] - blp[i])
        policy += min(r * adv[i], min(max(r, 1 - eps), 1 + eps) * adv[i])
        value += 0.5 * (v[i] - tgt[i]) ** 2
        ent_sum += ent[i]
        clipped += abs(r - 1) > eps
    policy_loss, value_loss, mean_entropy = -policy / B, value / B, ent_sum / B
    return {"loss": policy_loss + s.value_coef * value_loss - s.entropy_coef * mean_entropy,
            "policy_loss": policy_loss, "value_loss": value_loss, "entropy_loss": -mean_entropy,
            "clip_fraction": clipped / B}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("B", [1, 2, 7, 64])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("clip_coef,scale", [(0.2, 0.3), (0.1, 1.0), (0.5, 0.05)])
def test_ppo_loss_matches_per_sample_reference(seed, B, normalize, clip_coef, scale):
    s = dataclasses.replace(SETTINGS, normalize_advantages=normalize, clip_coef=clip_coef)
    b = batch(seed, B, scale)
    loss, parts = ppo_loss(**b, s=s)
    ref = ref_ppo_loss(**b, s=s)
    assert loss.item() == pytest.approx(ref["loss"], rel=1e-12, abs=1e-12)
    for key in ("policy_loss", "value_loss", "entropy_loss"):
        assert parts[key].item() == pytest.approx(ref[key], rel=1e-12, abs=1e-12), key
    assert parts["clip_fraction"].item() == pytest.approx(ref["clip_fraction"], rel=1e-7)   # a float32 mean


def test_ppo_loss_hand_worked():
    # eps = 0.2, c_v = 0.5, c_H = 0.1, no normalisation, two samples:
    #   i=0: r = 1.5, A = +2: min(3, 1.2*2 = 2.4) = 2.4  (clipped: no gradient)
    #   i=1: r = 0.5, A = +1: min(0.5, 0.8*1 = 0.8) = 0.5 (the pessimistic, unclipped term)
    # policy loss = -(2.4 + 0.5)/2 = -1.45
    # value loss  = 1/2 * ((1-0)^2 + (0-2)^2)/2 = 1.25;   entropy = (0.4 + 0.6)/2 = 0.5
    # loss = -1.45 + 0.5*1.25 - 0.1*0.5 = -0.875;  clip fraction: |1.5-1| and |0.5-1| > 0.2 -> 1
    s = dataclasses.replace(SETTINGS, clip_coef=0.2, value_coef=0.5, entropy_coef=0.1)
    t = lambda *x: torch.tensor(x, dtype=F64)  # noqa: E731
    loss, parts = ppo_loss(logp=t(math.log(1.5), math.log(0.5)), behaviour_logp=t(0.0, 0.0), values=t(1.0, 0.0),
                           advantages=t(2.0, 1.0), value_targets=t(0.0, 2.0), entropy=t(0.4, 0.6), s=s)
    assert loss.item() == pytest.approx(-0.875)
    assert parts["policy_loss"].item() == pytest.approx(-1.45)
    assert parts["value_loss"].item() == pytest.approx(1.25)
    assert parts["entropy_loss"].item() == pytest.approx(-0.5)
    assert parts["clip_fraction"].item() == 1.0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("normalize", [False, True])
def test_ppo_loss_gradient_matches_hand_derivation(seed, normalize):
    """dL/dlogp_i = -r_i A_i / B unless the clip is active (A_i > 0, r_i > 1+eps or A_i < 0, r_i < 1-eps),
    where it is 0;  dL/dV_i = c_v (V_i - V^targ_i) / B;  dL/dH_i = -c_H / B.
    Advantages and targets are data: no gradient reaches them."""
    s = dataclasses.replace(SETTINGS, normalize_advantages=normalize, clip_coef=0.2)
    B = 50
    b = batch(seed, B, 0.4)
    leaves = {k: b[k].clone().requires_grad_(True) for k in ("logp", "values", "entropy")}
    loss, _ = ppo_loss(**{**b, **leaves}, s=s)
    loss.backward()
    adv = b["advantages"]
    if normalize:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    r = (b["logp"] - b["behaviour_logp"]).exp()
    eps = s.clip_coef
    clipped = ((adv > 0) & (r > 1 + eps)) | ((adv < 0) & (r < 1 - eps))
    assert clipped.any() and (~clipped).any()
    expected_logp = torch.where(clipped, torch.zeros_like(r), -r * adv / B)
    torch.testing.assert_close(leaves["logp"].grad, expected_logp, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(leaves["values"].grad, s.value_coef * (b["values"] - b["value_targets"]) / B,
                               rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(leaves["entropy"].grad, torch.full((B,), -s.entropy_coef / B, dtype=F64),
                               rtol=1e-12, atol=1e-15)


def test_ppo_loss_is_pure():
    b = batch(0, 16)
    before = {k: v.clone() for k, v in b.items()}
    s = dataclasses.replace(SETTINGS, normalize_advantages=True)
    first, _ = ppo_loss(**b, s=s)
    second, _ = ppo_loss(**b, s=s)
    assert torch.equal(first, second)
    for k in b:
        assert torch.equal(b[k], before[k]), k


# --------------------------------------------------------------------------
# Distributions against torch.distributions.
# --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("n,scale", [(2, 1.0), (5, 3.0), (18, 10.0)])
def test_categorical_matches_torch_distributions(seed, n, scale):
    g = torch.Generator().manual_seed(seed)
    p, q = scale * torch.randn(2, 500, n, generator=g, dtype=F64)
    actions = torch.randint(0, n, (500,), generator=g)
    cat, ref_p, ref_q = Categorical(n), D.Categorical(logits=p), D.Categorical(logits=q)
    torch.testing.assert_close(cat.log_prob(p, actions), ref_p.log_prob(actions), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cat.entropy(p), ref_p.entropy(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(cat.kl(p, q), D.kl_divergence(ref_p, ref_q), rtol=1e-10, atol=1e-12)
    assert (cat.kl(p, p) == 0).all()
    assert cat.max_entropy == pytest.approx(math.log(n))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dim", [1, 3])
def test_diag_gaussian_matches_torch_distributions(seed, dim):
    g = torch.Generator().manual_seed(seed)
    space = gym.spaces.Box(-2.0, 2.0, (dim,), np.float32)
    dist = DiagGaussian(space)
    p, q = torch.randn(2, 400, 2 * dim, generator=g, dtype=F64)
    actions = torch.randn(400, dim, generator=g, dtype=F64) * 2

    def ref(params):
        return D.Independent(D.Normal(params[:, :dim], params[:, dim:].exp()), 1)

    torch.testing.assert_close(dist.log_prob(p, actions), ref(p).log_prob(actions), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dist.entropy(p), ref(p).entropy(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dist.kl(p, q), D.kl_divergence(ref(p), ref(q)), rtol=1e-10, atol=1e-12)
    assert (dist.kl(p, p) == 0).all()
    # The reference entropy of a bounded box is the uniform distribution's: log of its volume.
    assert dist.max_entropy == pytest.approx(dim * math.log(4.0))


def test_sampled_actions_have_the_log_prob_of_their_distribution():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 4, generator=g)
    actions, logp = Categorical(4).sample(logits, torch.Generator().manual_seed(1))
    torch.testing.assert_close(logp, D.Categorical(logits=logits).log_prob(actions))
    params = torch.randn(300, 4, generator=g)
    dist = DiagGaussian(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    actions, logp = dist.sample(params, torch.Generator().manual_seed(1))
    ref = D.Independent(D.Normal(params[:, :2], params[:, 2:].exp()), 1)
    torch.testing.assert_close(logp, ref.log_prob(actions))
