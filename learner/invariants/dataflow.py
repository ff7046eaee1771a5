"""Dataflow into the loss: the targets, advantages and loss gradients the learner trains on equal an independent
recomputation from the rollout.

value_head_affine (value). On each sampled update's first minibatch, how the
values move with the value head's output bias: mean_i dV_i/db. The network's
value head is affine, V = w.h + b, so every dV_i/db is exactly 1 and the
statistic |mean - 1| is 0 (bfloat16 autocast rounds the sum by under 1%).
A squashed or clipped value output reads its saturation (tanh at values of
2: 0.93), which keeps the values from reaching their targets; the value-bias
gradient identity that `gradient_mismatch` checks then no longer holds
either, and is not held against the optimizer. Limit 0.05.

returns_recomputed (returns). On sampled updates `reference_returns.vtrace_reference`
recomputes v_s and A_s in float64 from the rollout's rewards (after the
learner's declared reward scaling), episode ends and validity, the learner's
values at arrival and log-rhos log pi(a|x) - log mu(a|x) (pi: the learner at
arrival, mu: the rollout's behaviour log-probabilities), with the run's gamma,
lambda and clips. It is compared with what the minibatches train on:
    max( max_i |v_i - v_i^ref| / (max_i |v_i^ref| + 1e-8),
         max_i |A_i - A_i^ref| / (max_i |A_i^ref| + 0.01 max_i |v_i^ref| + 1e-8) )
over valid samples. The float32 recursion's error is a few ulps of the targets'
scale per step (measured below 1e-6); advantages are differences of values, so
their error is judged against 1% of the targets' scale too (bounding a healthy
reading by 1e-4 when values fit their targets almost exactly). Limit 1e-3: no
false alarm from rounding.

loss_gradient_policy / _value / _entropy (policy, value, policy). On each
sampled update's first minibatch (network as at arrival) the gradients the backward
pass put on the loss's inputs are compared with the closed form of the
reference loss L = -1/B sum_i min(r_i A_i, clip(r_i) A_i) + c_v/(2B) sum_i (V_i - t_i)^2
- c_H/B sum_i H_i, with r_i = exp(log pi_i - log mu_i) (mu from the rollout) and
A normalised per minibatch when the run normalises advantages:
    dL/dlog pi_i = -A_i r_i / B where r_i A_i <= clip(r_i) A_i (the unclipped
                   term is the min; torch's min splits ties evenly and clamp
                   passes the gradient inside its range, so ties count whole),
                   0 elsewhere;
    dL/dV_i = c_v (V_i - t_i) / B;      dL/dH_i = -c_H / B.
Statistic ||g - g_ref|| / ||g_ref||; NaN when both are 0 (entropy_coef 0), 1
when the output is detached (g = 0). float32 agrees to 1e-6; bfloat16 autocast
rounds each gradient to 2^-8 relative (about 4e-3): limit 0.05. The entropy
term also checks the entropies the loss was given against the closed form of
the minibatch's distribution parameters (float64, written here):
max_i |H_i - H_ref_i| / max(max_i |H_ref_i|, 1 nat), float32 rounding 1e-6,
taken with the gradient's error (the larger counts): a distribution whose
entropy is wrong is the policy's fault even with entropy_coef 0.

policy_loss_as_configured (policy). The first minibatch's ratios are 1 (the
policy has not moved yet), where no clip range shows. On sampled updates the
mean policy loss over every step of the update, which the loss reports, is
recomputed in float64 from each step's kept policy parameters, the rollout's
actions and behaviour log-probabilities and the batch's advantages (normalised
per minibatch where the run normalises them) with the configured clip range:
-mean_steps mean_i min(r_i A_i, clip(r_i) A_i). Statistic |loss - reference| /
max(|reference|, 1e-3 mean|r A|); float32 agrees to about 1e-6 of the scale:
limit 0.05. A loss that clips at another range than configured, or reports a
surrogate other than the one it steps with, reads above it once ratios leave
the range. NaN under bfloat16 autocast (its rounding is the scale of the
effect) and where advantages barely vary.
"""

from __future__ import annotations

import torch

from .common import F64, NAN, SPREAD_FLOOR, KeptSteps, _entropy, _nan_like, _relative_error_of


def returns_error(ref_targets, ref_advantages, targets, advantages) -> torch.Tensor:
    """Largest error of the learned targets and advantages against the reference, scale-free (flat, valid only)."""
    if targets.numel() == 0:
        return _nan_like(targets)
    ref_targets, ref_advantages = ref_targets.to(F64), ref_advantages.to(F64)
    target_scale = ref_targets.abs().amax()
    target_error = (targets.to(F64) - ref_targets).abs().amax() / (target_scale + 1e-8)
    advantage_scale = ref_advantages.abs().amax() + SPREAD_FLOOR * target_scale
    advantage_error = (advantages.to(F64) - ref_advantages).abs().amax() / (advantage_scale + 1e-8)
    return torch.maximum(target_error, advantage_error)


def handoff_error(received: list[torch.Tensor], produced: list[torch.Tensor]) -> torch.Tensor:
    """What a stage was handed against what the stage before it produced: the largest |received - produced| /
    max(max |produced|, 1e-8) over the pairs; 0 for exact copies (indexing and flattening copy exactly), 1 for a
    pair whose shapes differ. NaN when every pair is empty."""
    gaps = []
    for got, made in zip(received, produced, strict=True):
        if got.shape != made.shape:
            gaps.append(torch.ones((), dtype=F64, device=made.device))
        elif made.numel():
            got64, made64 = got.detach().to(F64), made.detach().to(F64)
            scale = made64.abs().amax().clamp_min(1e-8)
            gaps.append(((got64 - made64).abs().amax() / scale).nan_to_num(nan=1.0))
    return torch.stack(gaps).amax() if gaps else torch.full((), NAN, dtype=F64, device=produced[0].device)


def value_head_coupling(values: torch.Tensor, value_bias) -> torch.Tensor:
    """inv_value_head_affine: |mean_i dV_i/db - 1| for the value head's output bias b (`value_bias()`, the
    network's method); needs the values' graph. NaN when the network names no such bias or nothing was learned."""
    bias = value_bias() if callable(value_bias) else None
    if bias is None or values.numel() == 0 or not values.requires_grad:
        return torch.full((), NAN, dtype=F64, device=values.device)
    # autograd.grad adds into the retained .grad of the outputs it passes (the values'): keep the loss's.
    kept = values.grad.clone() if values.grad is not None else None
    (coupling,) = torch.autograd.grad(values.sum(), bias, retain_graph=True, allow_unused=True)
    values.grad = kept
    if coupling is None:   # the values do not depend on the bias at all
        return torch.ones((), dtype=F64, device=values.device)
    return (coupling.to(F64).sum() / values.numel() - 1).abs()


SURROGATE_FLOOR = 1e-3
"""policy_loss_as_configured's gap is judged against the larger of |reference| and this share of the mean
|r A| (the clipped surrogate's own scale): a loss near 0 (normalised advantages at ratio 1) is not divided by
its own rounding."""


def surrogate_error(s, kept: KeptSteps, advantages: torch.Tensor, policy_loss: torch.Tensor) -> torch.Tensor:
    """policy_loss_as_configured (module docstring): the update's mean clipped-surrogate loss recomputed from every
    kept step (`kept`) with the configured clip range and advantage normalisation, against the loss's own mean
    `policy_loss`."""
    raw = advantages[kept.positions].to(F64)
    a, sizes, step_of = raw, kept.sizes, kept.step_of
    if s.normalize_advantages:   # per minibatch, as the loss does: mean and unbiased std of each step's advantages
        centred = raw - (kept.per_step(raw) / sizes)[step_of]
        std = (kept.per_step(centred * centred) / (sizes - 1).clamp_min(1)).sqrt()
        a = torch.where(sizes[step_of] > 1, centred / (std[step_of] + 1e-8), raw)
    ratio = kept.log_ratio.exp()
    unclipped = ratio * a
    surrogate = torch.minimum(unclipped, ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef) * a)
    reference = (-kept.per_step(surrogate) / sizes).mean()
    scale = (kept.per_step(unclipped.abs()) / sizes).mean()
    gap = (policy_loss.to(F64) - reference).abs() / torch.maximum(reference.abs(), SURROGATE_FLOOR * scale)
    # Advantages that barely vary normalise to rounding noise (as loss_gradient_policy): not measurable.
    measurable = (raw.std() > 1e-5 * raw.abs().amax()) | (not s.normalize_advantages)
    return torch.where(measurable & (scale > 0), torch.where(gap.isnan(), 1.0, gap), NAN)


def _grad(output: torch.Tensor) -> torch.Tensor:
    """d loss / d output as the backward pass left it (retain_grad); 0 where the loss does not reach it."""
    return output.grad.to(F64) if output.grad is not None else torch.zeros_like(output, dtype=F64)




def loss_gradient_errors(dist, params, logp, values, entropy, behaviour_logp, advantages, targets,
                         s) -> dict[str, torch.Tensor]:
    """The backward pass's dL/dlog pi, dL/dV, dL/dH against the reference loss's closed form, and the entropies the
    loss was given against those of its distributions' parameters (module docstring)."""
    B = logp.numel()
    a = advantages.to(F64)
    # Advantages that barely vary (a probe's value learned to rounding) normalise to rounding noise, which float32
    # and float64 round differently: the policy term is then not measurable. Otherwise normalise in the loss's own
    # precision and order of operations, so only a different formula can differ.
    measurable = a.std() > 1e-5 * a.abs().amax() if B > 1 else torch.ones((), dtype=torch.bool, device=a.device)
    if s.normalize_advantages and B > 1:
        a32 = advantages.float()
        a = ((a32 - a32.mean()) / (a32.std() + 1e-8)).to(F64)
    ratio = (logp.detach().to(F64) - behaviour_logp.to(F64)).exp()
    unclipped_is_min = ratio * a <= ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef) * a
    policy = torch.where(unclipped_is_min, -a * ratio / B, 0.0)
    value = s.value_coef * (values.detach().to(F64) - targets.to(F64)) / B
    bonus = torch.full_like(value, -s.entropy_coef / B)
    reference = _entropy(dist, params.detach())
    entropy_error = (entropy.detach().to(F64) - reference).abs().amax() / reference.abs().amax().clamp_min(1.0)
    # The three terms at once: one norm each of the gradients, the references and their differences.
    grads, refs = torch.stack([_grad(logp), _grad(values), _grad(entropy)]), torch.stack([policy, value, bonus])
    errors = _relative_error_of((grads - refs).norm(dim=1), grads.norm(dim=1), refs.norm(dim=1))
    policy_error = torch.where(measurable | (not s.normalize_advantages), errors[0], NAN)
    return {"inv_loss_gradient_policy": policy_error, "inv_loss_gradient_value": errors[1],
            "inv_loss_gradient_entropy": torch.fmax(errors[2], entropy_error)}   # fmax: NaN (coef 0) gives way
