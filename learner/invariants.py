"""The learner's statistics of the invariants (telemetry/invariants.py), one 0-d tensor per update each.

Every statistic is 0 when its invariant holds exactly, larger the more it is
broken, NaN when this update did not measure it. They stay on the device and go
to the host with the update's other statistics (no `.item()`, no extra sync).
The expensive ones are *sampled*: every update of the first 16, then every 8th
(`is_sampled`). Cost on CartPole batches (4096 samples, 4 x 8 minibatches, CPU,
one thread; CPU time inside the hooks against the rest of learn()): 5.6% of a
sampled update, 1.3% of the others, 1.9% on average. The references below are written apart from the code they check
(no call into `returns`, `diagnostics` or through the `ppo` module), in float64.

Derivations and false-alarm bounds (docs/invariants.md)
--------------------------------------------------------

sampling_logp (actor). For a draw a ~ mu(.|s): E[log mu(a|s)] = -H(mu(.|s)) and
Var[log mu(a|s)] = v(mu(.|s)) depend on the recorded distribution alone
(Categorical: sum_k p_k (log p_k + H)^2; diagonal Gaussian: d/2, since
log mu(a) + H = d/2 - |z|^2/2 with z ~ N(0, I_d)). Given everything before it,
each draw is fresh, so D_i = log mu_i(a_i) + H_i is a martingale difference
sequence over the batch (states may be correlated: the sequence of conditional
means is still 0) with conditional variances v_i, and
    z = sum_i D_i / sqrt(sum_i v_i + n tau^2),   tau = 1e-3 nats,
is asymptotically N(0, 1) (martingale CLT). tau absorbs the float32 rounding of
the recorded log-probabilities (about 1e-7 nats each; a systematic error of
1e-6 per sample over 4096 samples moves z by 0.06). Statistic |z|; limit 6:
2e-9 per batch under the normal limit. Without any distributional assumption,
Chebyshev bounds one batch by 1/36, and the 3 batches in a row a break needs by
(1/36)^3 = 2e-5. The Gaussian check is for the unsquashed draw, which is what a
rollout stores: the runner clips only the copy of the action it sends the env.

sampling_frequency (actor). Discrete: for each action k, count_k - sum_i p_ik
sums martingale differences (1[a_i = k] - p_ik) of conditional variance
p_ik (1 - p_ik); z_k = (count_k - sum_i p_ik) / sqrt(sum_i p_ik (1 - p_ik) + n tau^2).
Continuous: per dimension j the standardised draws (a_ij - m_ij) / sigma_ij are
independent N(0, 1) given the past, so z_j = sum_i (a_ij - m_ij) / sigma_ij / sqrt(n)
is exactly N(0, 1). Statistic max_k |z_k|; with K actions or dimensions the
bound is K x 2e-9 per batch (Chebyshev: K / 36).

behaviour_record (actor). `record_discrepancy`: max |log mu(a; stored params) -
stored log mu| over valid steps. The actor computed the stored value from those
parameters and that action; recomputing it differs only by float32 rounding
(about 1e-6 nats), far below the limit of 1e-3.

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
update's first minibatch (network as at arrival) the gradients the backward
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

optimizer_coverage (optimizer). Count of parameters that require a gradient
but are in no optimizer group, plus parameters whose gradient on the update's
first minibatch is above 1e-6 of the largest parameter's (norms) and that did
not change at all over the update. Adam's first step of an element with
gradient g moves it by lr g / (|g| + eps) (bias-corrected), far above float32
resolution for any gradient that is not negligible against the largest; the
later steps of the update would have to undo it exactly. Exact: limit 0. The
"did not change" part is not judged while the learning rate is 0 (the
statistic is then the missing count when there is one, else NaN).

gradient_of_loss (optimizer). On each update's first minibatch, the norm of
every parameter's .grad between zero_grad and the backward pass, against its
norm after it: ||grad before|| / ||grad after||. The gradient the optimizer
steps with must be this backward pass's alone, so a correct learner reads
exactly 0 in any precision; gradients of earlier steps left by a missing or
misplaced zero_grad (or a parameter whose .grad the optimizer does not zero)
read their size against this minibatch's gradient. With clipping that stale
part is about max_grad_norm against a gradient norm of 5 to 50: 1e-2 to 1e-1,
which the projection onto the value head's bias that `gradient_mismatch`
exports (limit 0.05, for bfloat16's sake) misses about half the time. Limit
1e-3 (exact: no false alarm).

policy_starved (preprocessing). On sampled updates, when the first minibatch's
gradient is clipped (||g|| > max_grad_norm): ||g|| / ||g_policy||, with g_policy
the gradient of the policy loss term alone (one extra autograd.grad); 0 when
the gradient is not clipped. Not measured when the policy term's gradient is
exactly 0 (every sample clipped, or a collapsed policy: no share to speak of)
or when loss_gradient_policy is broken on the update (the policy term is then
not the surrogate, and its size says nothing of the scale). The policy term's
gradient is of the order of the normalised advantages' spread times the
policy's sensitivity; the value term's grows with the targets' scale. Healthy
runs read, after update 10: CartPole up to 6e2 (median 1.5e2), Acrobot up to
3.7e2, Pendulum up to 1.2e3 at gamma 0.9 and about 3e3 at gamma 0.99 (raw
rewards of -16 a step). A ratio of 1e4 needs value errors about 1e4 times the
advantages' spread, and 20 sampled updates in a row.

telemetry_recomputed (telemetry). On sampled updates, float64 code of its own
recomputes residual_variance, relative_entropy, advantage/target/value mean
and std (population std over valid steps) from the tensors the learner
exported them from, the KL (behaviour parameters against the last epoch's
minibatch parameters, stored on sampled updates) and the clip fraction (every
step's minibatch parameters). Statistic: the largest |exported - reference| /
max(|reference|, floor). Floors (absolute, per quantity): residual variance and
relative entropy 0.01, clip fraction 0.1, KL 1e-3 nats, means and stds 1% of
the quantity's |mean| + std. Float32 against float64 differs by about 1e-6 of
these, a clip fraction by 1/B per sample on the clip boundary (one in 1e5
updates): limit 1e-3. A residual variance that is undefined (NaN) on one side
and defined on the other is a disagreement of 1, unless the targets' spread is
within 2% of the undefined threshold (then skipped). Two diagnostics come from
the loss's own parts: the clip fraction (the loss's ratio) and the entropy (the
distribution the loss uses). They are not held against telemetry on updates
where loss_gradient_policy, respectively loss_gradient_entropy, is broken:
that invariant names the fault where it is.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from .networks import Categorical
from .reference_returns import vtrace_reference

NAN = float("nan")
F64 = torch.float64
TAU = 1e-3
"""Nats of float32 rounding allowed per recorded log-probability."""
SAMPLED_FIRST, SAMPLED_EVERY = 16, 8
MOVED_FRACTION = 1e-6
"""A parameter is judged by optimizer_coverage when its gradient is above this share of the largest."""
FLOORS = {"residual_variance": 0.01, "relative_entropy": 0.01, "clip_fraction": 0.1, "kl": 1e-3}
SPREAD_FLOOR = 0.01
LOSS_GRADIENT_TOLERANCE = 0.05
"""The loss_gradient invariants' limit (telemetry.invariants, which the learner may not import)."""
KEYS = ("inv_sampling_logp", "inv_sampling_frequency", "inv_behaviour_record", "inv_returns_recomputed",
        "inv_loss_gradient_policy", "inv_loss_gradient_value", "inv_loss_gradient_entropy",
        "inv_optimizer_coverage", "inv_gradient_of_loss", "inv_policy_starved", "inv_telemetry_recomputed")


def is_sampled(update: int) -> bool:
    """Whether the expensive checks run on this update (counted from 0)."""
    return update < SAMPLED_FIRST or update % SAMPLED_EVERY == 0


# ----------------------------------------------------------------- distributions, float64, written here


def _split(params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dim = params.shape[-1] // 2
    return params[..., :dim], params[..., dim:]


def _log_prob(dist, params, actions) -> torch.Tensor:
    params = params.to(F64)
    if isinstance(dist, Categorical):
        return F.log_softmax(params, -1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    mean, log_std = _split(params)
    z = (actions.to(F64) - mean) / log_std.exp()
    return (-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def _entropy(dist, params) -> torch.Tensor:
    params = params.to(F64)
    if isinstance(dist, Categorical):
        logp = F.log_softmax(params, -1)
        p = logp.exp()
        return -torch.where(p > 0, p * logp, 0.0).sum(-1)
    _, log_std = _split(params)
    return (log_std + 0.5 * (1 + math.log(2 * math.pi))).sum(-1)


def _kl(dist, p_params, q_params) -> torch.Tensor:
    """KL(p || q) per sample, never below 0 (as exported)."""
    p_params, q_params = p_params.to(F64), q_params.to(F64)
    if isinstance(dist, Categorical):
        logp, logq = F.log_softmax(p_params, -1), F.log_softmax(q_params, -1)
        p = logp.exp()
        return torch.where(p > 0, p * (logp - logq), 0.0).sum(-1).clamp_min(0.0)
    (mp, lp), (mq, lq) = _split(p_params), _split(q_params)
    var_p, var_q = (2 * lp).exp(), (2 * lq).exp()
    return (lq - lp + (var_p + (mp - mq) ** 2) / (2 * var_q) - 0.5).sum(-1).clamp_min(0.0)


def _nan_like(ref: torch.Tensor) -> torch.Tensor:
    return torch.full((), NAN, device=ref.device)


def _largest(values: list[torch.Tensor]) -> torch.Tensor:
    """The largest of 0-d statistics, ignoring NaN (not measured); NaN when none was measured."""
    worst = torch.stack([v.to(F64) for v in values]).nan_to_num(nan=-torch.inf).amax()
    return torch.where(worst == -torch.inf, NAN, worst)


# ----------------------------------------------------------------- sampling (the actor's record)


def sampling_statistics(dist, params, actions, logp) -> tuple[torch.Tensor, torch.Tensor]:
    """(sampling_logp, sampling_frequency) of the valid samples' recorded parameters [n, P], actions and
    log-probabilities (module docstring); NaN when there is none."""
    n = logp.shape[0]
    if n == 0:
        return _nan_like(logp), _nan_like(logp)
    params = params.to(F64)
    if isinstance(dist, Categorical):
        log_p = F.log_softmax(params, -1)
        p = log_p.exp()
        p_log_p = torch.where(p > 0, p * log_p, 0.0)
        entropy = -p_log_p.sum(-1)
        variance = torch.where(p > 0, p * (log_p + entropy.unsqueeze(-1)).pow(2), 0.0).sum()
        # index_add, not one_hot or bincount: those read the actions' range back to the host on CUDA.
        hits = torch.zeros(p.shape[-1], dtype=F64, device=p.device).index_add_(
            0, actions.long(), torch.ones(n, dtype=F64, device=p.device))
        expected = p.sum(0)
        z = (hits - expected) / ((p * (1 - p)).sum(0) + n * TAU ** 2).sqrt()
    else:   # log mu(a) + H = d/2 - |z|^2 / 2 with z ~ N(0, I_d): variance d/2 per sample
        mean, log_std = _split(params)
        entropy = (log_std + 0.5 * (1 + math.log(2 * math.pi))).sum(-1)
        variance = torch.full((), n * mean.shape[-1] / 2, dtype=F64, device=params.device)
        z = ((actions.to(F64) - mean) / log_std.exp()).sum(0) / math.sqrt(n)
    excess = logp.to(F64).sum() + entropy.sum()
    return (excess / (variance + n * TAU ** 2).sqrt()).abs(), z.abs().amax()


# ----------------------------------------------------------------- dataflow (returns, loss gradients)


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


def _grad(output: torch.Tensor) -> torch.Tensor:
    """d loss / d output as the backward pass left it (retain_grad); 0 where the loss does not reach it."""
    return output.grad.to(F64) if output.grad is not None else torch.zeros_like(output, dtype=F64)


def _relative_error_of(error: torch.Tensor, actual_norm: torch.Tensor, reference_norm: torch.Tensor) -> torch.Tensor:
    """error / ||reference||; NaN when both norms are 0 (norms are never negative)."""
    return torch.where(actual_norm + reference_norm <= 1e-30, NAN, error / reference_norm.clamp_min(1e-30))


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


# ----------------------------------------------------------------- optimisation


def _gradient_of(loss: torch.Tensor, params: list[torch.Tensor], keep_graph: bool) -> list[torch.Tensor]:
    """d loss / d param for each parameter, in float64 (zeros where the loss does not reach it)."""
    grads = (torch.autograd.grad(loss, params, retain_graph=keep_graph, allow_unused=True) if loss.requires_grad
             else [None] * len(params))
    return [torch.zeros_like(p, dtype=F64) if g is None else g.to(F64) for p, g in zip(params, grads, strict=True)]


def _norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of each tensor, stacked (one fused kernel where torch has it)."""
    if hasattr(torch, "_foreach_norm"):
        return torch.stack(torch._foreach_norm([t.detach() for t in tensors]))
    return torch.stack([t.detach().norm() for t in tensors])


def _norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all the tensors together (a non-empty list)."""
    return _norms(tensors).to(F64).norm()


def policy_share(params: list[torch.Tensor], grad_norm: torch.Tensor, policy_loss: torch.Tensor,
                 max_grad_norm: float, loss_gradient_policy: torch.Tensor) -> torch.Tensor:
    """||g|| / ||g_policy|| when the gradient is clipped, else 0. Needs policy_loss's graph (frees it).

    Not measured (NaN) when the policy term's gradient is exactly 0 (every sample clipped: there is no share to
    speak of) or is not the surrogate's (the loss invariant names that fault; its size says nothing of scale).
    """
    own = _norm(_gradient_of(policy_loss, [p for p in params if p.requires_grad], keep_graph=False))
    share = torch.where(grad_norm > max_grad_norm, grad_norm / own.clamp_min(1e-30), 0.0)
    return torch.where((own == 0) | (loss_gradient_policy > LOSS_GRADIENT_TOLERANCE), NAN, share)


def optimizer_coverage(params: list[torch.Tensor], optimizer, grad_norms: torch.Tensor | None,
                       before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Parameters needing a gradient outside every optimizer group, plus those with a gradient that never moved."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = sum(1 for p in params if p.requires_grad and id(p) not in stepped)
    lr_zero = any(group.get("lr", 0.0) == 0 for group in optimizer.param_groups)
    if lr_zero or grad_norms is None:
        return torch.full((), float(missing) if missing else NAN, device=before.device)
    moved = _norms(list(torch.split(after - before, [p.numel() for p in params]))) > 0
    judged = grad_norms > MOVED_FRACTION * grad_norms.amax()
    frozen = (judged & ~moved).sum()
    return (frozen + missing).float()


# ----------------------------------------------------------------- telemetry, recomputed


def _disagreement(exported: list[torch.Tensor], reference: list[torch.Tensor], floor: list) -> torch.Tensor:
    """Per quantity |exported - reference| / max(|reference|, floor); NaN when both are undefined, 1 when one is."""
    exported, reference = torch.stack([e.to(F64) for e in exported]), torch.stack([r.to(F64) for r in reference])
    floor = torch.stack([torch.as_tensor(f, dtype=F64, device=reference.device) for f in floor])
    gap = (exported - reference).abs() / torch.maximum(reference.abs(), floor)
    return torch.where(torch.isnan(reference) & torch.isnan(exported), NAN, torch.where(torch.isnan(gap), 1.0, gap))


def _moments(x: torch.Tensor, m: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = (x.to(F64) * m).sum() / n
    return mean, (((x.to(F64) - mean) * m).pow(2).sum() / n).sqrt()


def _residual_variance(targets, values, m, n, min_std) -> torch.Tensor:
    """Var(t - V) / Var(t) in float64; NaN when undefined, and +inf when the spread is too close to call."""
    t_mean, t_std = _moments(targets, m, n)
    r_mean, r_std = _moments(targets.to(F64) - values.to(F64), m, n)
    t_var, threshold = t_std ** 2, min_std.to(F64) ** 2
    defined = (n * t_var > 1e-12) & (t_var >= threshold)
    borderline = (((t_var - threshold).abs() <= 0.02 * threshold) | ((n * t_var - 1e-12).abs() <= 1e-12))
    ratio = torch.where(defined, r_std ** 2 / t_var.clamp_min(1e-300), NAN)
    return torch.where(borderline, torch.inf, ratio)


def flat_target_spread(reward_scale, valid, done, gamma: float) -> torch.Tensor:
    """The targets' std below which residual variance is undefined: 1% of r_max x the horizon
    min(1 / (1 - gamma), mean episode length); 0 when there is no horizon (gamma 1, no episode end)."""
    episodes = (done & valid).to(F64).sum()
    horizon = torch.where(episodes > 0, valid.to(F64).sum() / episodes.clamp_min(1), torch.inf)
    if gamma < 1:
        horizon = horizon.clamp(max=1 / (1 - gamma))
    return torch.where(torch.isinf(horizon), 0.0, 0.01 * reward_scale.to(F64) * horizon)


def arrival_disagreement(dist, params, values, targets, advantages, valid, min_std,
                         exported: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Relative disagreements of the batch statistics exported at arrival with their recomputation: (relative
    entropy's, the largest of the others)."""
    m = valid.to(F64)
    n = m.sum().clamp_min(1)
    exported_, reference, floor = [], [], []
    for name, x in (("value", values), ("target", targets), ("advantage", advantages)):
        mean, std = _moments(x, m, n)
        exported_ += [exported[f"{name}_mean"], exported[f"{name}_std"]]
        reference += [mean, std]
        floor += [SPREAD_FLOOR * (mean.abs() + std)] * 2
    exported_.append(exported["relative_entropy"])
    reference.append((_entropy(dist, params) * m).sum() / n / dist.max_entropy)
    floor.append(FLOORS["relative_entropy"])
    ratio = _residual_variance(targets, values, m, n, min_std)
    exported_.append(exported["residual_variance"])
    reference.append(ratio)
    floor.append(FLOORS["residual_variance"])
    gaps = _disagreement(exported_, reference, floor)
    gaps[-1] = torch.where(torch.isinf(ratio), NAN, gaps[-1])   # too close to the undefined threshold to call
    entropy_gap, others = gaps[-2], _largest([*gaps[:-2], gaps[-1]])
    return tuple(torch.where(valid.any(), x, NAN) for x in (entropy_gap, others))


# ----------------------------------------------------------------- the learner's hooks


class LearnerInvariants:
    """Per update: hooks called by PPOLearner at arrival, on its first minibatch, on each step and at the report.

    Everything is kept on the learner's device; `report` hands the `inv_*` statistics to the update's one
    host transfer. State lives for one update only.
    """

    def __init__(self, learner):
        self.learner = learner
        self.sampled = False
        self.out: dict[str, torch.Tensor] = {}
        self.steps: list[tuple[torch.Tensor, torch.Tensor, bool]] = []
        self.grad_norms: torch.Tensor | None = None
        self.grad_before: torch.Tensor | None = None
        self.behaviour_logp: torch.Tensor | None = None
        self.arrival_telemetry: tuple[torch.Tensor, torch.Tensor] | None = None

    def arrival(self, batch, r: dict, params_all: torch.Tensor, values_all: torch.Tensor,
                index: torch.Tensor) -> None:
        """The batch as it arrived: sampling, the returns' reference and the arrival statistics' recomputation."""
        learner = self.learner
        s, dist = learner.s, learner.net.dist
        self.sampled = is_sampled(learner.updates)
        self.steps, self.grad_norms, self.arrival_telemetry = [], None, None
        nan = torch.full((), NAN, device=learner.device)
        self.out = dict.fromkeys(KEYS, nan)
        valid, actions = r["valid"], r["actions"]
        T = valid.shape[0]
        flat = lambda x: x.reshape(T * valid.shape[1], *x.shape[2:]).index_select(0, index)  # noqa: E731
        self.behaviour_logp = flat(r["behaviour_logp"])
        self.out["inv_sampling_logp"], self.out["inv_sampling_frequency"] = sampling_statistics(
            dist, flat(r["behaviour_params"]), flat(actions), self.behaviour_logp)
        if not self.sampled:
            return
        params = params_all[:T]
        log_rhos = _log_prob(dist, params, actions) - r["behaviour_logp"].to(F64)
        ref_targets, ref_advantages = vtrace_reference(
            values_all[:T], values_all[1:], r["rewards"], r["terminated"], r["truncated"], valid, log_rhos,
            s.gamma, s.gae_lambda, s.vtrace_rho_clip, s.vtrace_c_clip)
        self.out["inv_returns_recomputed"] = returns_error(flat(ref_targets), flat(ref_advantages), batch.mb_targets,
                                                           batch.mb_adv)
        min_std = flat_target_spread(learner.reward_scale, valid, r["terminated"] | r["truncated"], s.gamma)
        self.arrival_telemetry = arrival_disagreement(dist, params, batch.values, batch.targets, batch.advantages,
                                                      valid, min_std, batch.stats)

    @property
    def keeps_graph(self) -> bool:
        """Whether the first minibatch's backward pass must keep its graph (for policy_starved)."""
        return self.sampled

    def before_backward(self) -> None:
        """On the first minibatch, between zero_grad and the backward pass: what .grad holds already."""
        held = [p.grad for p in self.learner.net.parameters() if p.grad is not None]
        self.grad_before = _norm(held) if held else torch.zeros((), dtype=F64, device=self.learner.device)

    def first_minibatch(self, policy_loss, dist_params, logp, values, entropy, b, mb) -> None:
        """After the first minibatch's backward pass (outputs' gradients retained, gradients not yet clipped)."""
        learner = self.learner
        self.out.update(loss_gradient_errors(learner.net.dist, dist_params, logp, values, entropy,
                                             self.behaviour_logp[mb], b.mb_adv[mb], b.mb_targets[mb], learner.s))
        params = list(learner.net.parameters())
        self.grad_norms = _norms([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
        grad_norm = self.grad_norms.to(F64).norm()
        # What the optimizer steps with must be this backward pass's alone: nothing may be in .grad before it.
        self.out["inv_gradient_of_loss"] = _relative_error_of(self.grad_before, self.grad_before, grad_norm)
        if self.sampled:   # the graph was kept for one more backward pass through the policy term
            self.out["inv_policy_starved"] = policy_share(params, grad_norm, policy_loss, learner.s.max_grad_norm,
                                                          self.out["inv_loss_gradient_policy"])

    def step(self, mb: torch.Tensor, mb_params: torch.Tensor, last_epoch: bool) -> None:
        """Each minibatch's policy parameters, kept on sampled updates for the KL and clip fraction's check."""
        if self.sampled:
            self.steps.append((mb, mb_params.detach(), last_epoch))

    def report(self, b, u, after: torch.Tensor, stats: dict) -> dict[str, torch.Tensor]:
        """The update's `inv_*` statistics (0-d tensors on the device)."""
        learner = self.learner
        params = list(learner.net.parameters())
        self.out["inv_behaviour_record"] = stats["record_discrepancy"]
        self.out["inv_optimizer_coverage"] = optimizer_coverage(params, learner.optimizer, self.grad_norms,
                                                                u.before, after)
        if self.sampled and self.arrival_telemetry is not None:
            # The exported entropy is the distribution's, which the loss uses too: when the loss's entropies are
            # off their closed form, the policy's invariant names the fault and the diagnostic is not held to it.
            entropy_gap, others = self.arrival_telemetry
            entropy_off = self.out["inv_loss_gradient_entropy"] > LOSS_GRADIENT_TOLERANCE
            gaps = [others, torch.where(entropy_off, NAN, entropy_gap)]
            if self.steps:
                gaps += self._update_disagreement(b, stats, self.out["inv_loss_gradient_policy"])
            self.out["inv_telemetry_recomputed"] = _largest(gaps)
        out, self.steps = self.out, []
        return out

    def _update_disagreement(self, b, stats: dict, loss_gradient_policy: torch.Tensor) -> list[torch.Tensor]:
        """KL (last epoch) and clip fraction (every step) recomputed from the kept minibatch parameters.

        The clip fraction is the loss's own statistic: when the loss's policy gradient is off its closed form,
        the loss invariant names the fault, and the clip fraction is not held against telemetry.
        """
        dist, clip = self.learner.net.dist, self.learner.s.clip_coef
        mbs = torch.cat([mb for mb, _, _ in self.steps])
        params = torch.cat([p for _, p, _ in self.steps])
        # Built on the host and sent without waiting: the device's queue is never drained here.
        host_sizes = torch.tensor([mb.numel() for mb, _, _ in self.steps])
        sizes = host_sizes.to(mbs.device, non_blocking=True)
        step_of = torch.repeat_interleave(torch.arange(len(self.steps)), host_sizes).to(mbs.device, non_blocking=True)
        log_ratio = _log_prob(dist, params, b.mb_actions[mbs]) - self.behaviour_logp[mbs].to(F64)
        clipped = ((log_ratio.exp() - 1).abs() > clip).to(F64)
        fractions = torch.zeros(len(self.steps), dtype=F64, device=mbs.device).index_add_(0, step_of, clipped)
        clip_fraction = (fractions / sizes.clamp_min(1)).mean()
        last_mbs = torch.cat([mb for mb, _, last in self.steps if last])
        last_params = torch.cat([p for _, p, last in self.steps if last])
        kl = _kl(dist, b.mb_params[last_mbs], last_params).sum() / max(b.count, 1)
        clip_gap, kl_gap = _disagreement([stats["clip_fraction"], stats["kl"]], [clip_fraction, kl],
                                         [FLOORS["clip_fraction"], FLOORS["kl"]])
        return [torch.where(loss_gradient_policy > LOSS_GRADIENT_TOLERANCE, NAN, clip_gap), kl_gap]
