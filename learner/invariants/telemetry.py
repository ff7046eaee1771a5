"""Telemetry self-consistency: every exported diagnostic agrees with an independent float64 recomputation.

telemetry_recomputed (telemetry). On sampled updates, float64 code of its own
recomputes, from the tensors the learner exported them from: the min, max,
mean and std (population, over valid steps) of values, targets, advantages
and rewards; the residual variance; the relative entropy and its change from
the initial policy (whose entropy the check takes itself from the first batch); the
terminal and penultimate terminal correlations; the value-target scale
(max |target| against r_max / (1 - gamma), the learner's r_max an input); the
KL (behaviour parameters against the last epoch's minibatch parameters, stored
on sampled updates) and the clip fraction (every step's minibatch
parameters); each step's statistics as the step is taken (StepStatistics: the
gradient's norm, abs-max, mean square and heads' norms from the parameters' own
`.grad`, the value and entropy loss terms). Statistic: the largest
|exported - reference| / max(|reference|,
floor). Floors (absolute, per quantity): residual variance, relative entropy,
entropy change (nats), correlations and the target scale 0.01, clip fraction
0.1, KL 1e-3 nats, a distribution's statistics 1% of its |mean| + std, the
value loss 1e-5, the gradient's statistics none (relative to their own size).
Float32 against float64 differs by about 1e-6 of these; a sample whose ratio
lies within 1e-4 of the clip boundary may be counted on either side, so that
share of the clip fraction is slack, not a disagreement: limit 1e-3. A
residual variance that is undefined (NaN) on one side and defined on the
other is a disagreement of 1, unless the targets' spread is within 2% of the
undefined threshold (then skipped); a correlation is judged only where both
inputs spread by more than float32's rounding. Two diagnostics come from
the loss's own parts: the clip fraction (the loss's ratio) and the entropy (the
distribution the loss uses). They are not held against telemetry on updates
where loss_gradient_policy, respectively loss_gradient_entropy, is broken:
that invariant names the fault where it is; likewise the value loss where
loss_gradient_value or value_loss_inputs is.
"""

from __future__ import annotations

import torch

from .common import F64, LOSS_GRADIENT_TOLERANCE, NAN, SPREAD_FLOOR, KeptSteps, _entropy, _kl, _largest

FLOORS = {"residual_variance": 0.01, "relative_entropy": 0.01, "clip_fraction": 0.1, "kl": 1e-3,
          "correlation": 0.01, "entropy_change": 0.01, "value_target_scale": 0.01}
CLIP_BOUNDARY = 1e-4
"""A ratio this close to 1 +- clip may fall on the other side of the clip in the learner's float32: its log-ratio
is a difference of log-probabilities (tens of nats for a many-dimensional Gaussian) rounded at 6e-8 of each."""
GRADIENT_FLOOR = 1e-30
"""Gradient statistics are judged relative to their own size: a converged run's gradients are tiny but exact."""
CORRELATION_SPREAD = 1e-4
"""A correlation's inputs must spread by more than this share of their size to be judged (float32 rounds at 6e-8)."""


def _disagreement(exported: list[torch.Tensor], reference: list[torch.Tensor], floor: list) -> torch.Tensor:
    """Per quantity |exported - reference| / max(|reference|, floor); 0 when equal; NaN when both are undefined,
    1 when one is."""
    exported, reference = torch.stack([e.to(F64) for e in exported]), torch.stack([r.to(F64) for r in reference])
    floor = torch.stack([torch.as_tensor(f, dtype=F64, device=reference.device) for f in floor])
    gap = (exported - reference).abs() / torch.maximum(reference.abs(), floor)
    gap = torch.where(exported == reference, 0.0, gap)    # equal, floor 0 included (all-zero advantages: 0 / 0)
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


def _correlation(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Pearson correlation in float64 where `mask` holds; NaN (not judged) with fewer than three points or an
    input whose spread is within float32's rounding of its size, where float32 and float64 may call it
    undefined differently."""
    m = mask.to(F64)
    n = m.sum()
    x, y = x.to(F64), y.to(F64)
    xc = (x - (x * m).sum() / n.clamp_min(1)) * m
    yc = (y - (y * m).sum() / n.clamp_min(1)) * m
    spread = lambda c, v: (c.pow(2).sum() / n.clamp_min(1)).sqrt() / ((v * m).abs().amax() + 1e-30)  # noqa: E731
    judged = (n >= 3) & (spread(xc, x) > CORRELATION_SPREAD) & (spread(yc, y) > CORRELATION_SPREAD)
    denom = (xc.pow(2).sum() * yc.pow(2).sum()).sqrt()
    return torch.where(judged, (xc * yc).sum() / denom.clamp_min(1e-300), NAN)


def arrival_disagreement(dist, params, values, targets, advantages, valid, min_std, exported: dict,
                         rewards, terminated, done, initial_entropy, reward_scale, gamma: float
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Relative disagreements of the batch statistics exported at arrival with their recomputation in float64
    from the same tensors: (the entropy's (relative entropy and its change from the initial policy), the largest
    of the others: min, max, mean and std of values, targets, advantages and rewards over valid steps, the
    residual variance, the terminal correlations and the value-target scale), and the batch's mean entropy per
    action dimension. `initial_entropy` None: this is the run's first batch, the initial policy's own."""
    m = valid.to(F64)
    n = m.sum().clamp_min(1)
    exported_, reference, floor = [], [], []
    for name, x in (("value", values), ("target", targets), ("advantage", advantages), ("reward", rewards)):
        mean, std = _moments(x, m, n)
        x64 = x.to(F64)
        low = torch.where(valid, x64, torch.inf).amin()
        high = torch.where(valid, x64, -torch.inf).amax()
        for stat, ref in (("mean", mean), ("std", std), ("min", low), ("max", high)):
            exported_.append(exported[f"{name}_{stat}"])
            reference.append(ref)
            floor.append(SPREAD_FLOOR * (mean.abs() + std))
    final = terminated & valid
    for key, ref in (("terminal_correlation", _correlation(values, rewards, final)),
                     ("penultimate_terminal_correlation",
                      _correlation(values[:-1], rewards[1:], final[1:] & valid[:-1] & ~done[:-1]))):
        # Judged only where the reference judges: a correlation too close to undefined is not held to it.
        exported_.append(torch.where(torch.isnan(ref), NAN, exported[key].to(F64)))
        reference.append(ref)
        floor.append(FLOORS["correlation"])
    if gamma < 1:   # |targets| against the bound r_max / (1 - gamma), with the run's r_max as the learner has it
        bound = reward_scale.to(F64) / (1 - gamma)
        scale = torch.where(bound > 0, torch.where(valid, targets.to(F64).abs(), 0.0).amax() / bound.clamp_min(1e-30),
                            NAN)
        exported_.append(exported["value_target_scale"])
        reference.append(scale)
        floor.append(FLOORS["value_target_scale"])
    entropy = (_entropy(dist, params) * m).sum() / n
    per_dimension = entropy / dist.dims
    initial = per_dimension if initial_entropy is None else initial_entropy.to(F64)
    entropy_exported = [exported["relative_entropy"], exported["entropy_change"]]
    entropy_reference = [entropy / dist.max_entropy, per_dimension - initial]
    entropy_floor = [FLOORS["relative_entropy"], FLOORS["entropy_change"]]
    ratio = _residual_variance(targets, values, m, n, min_std)
    exported_.append(exported["residual_variance"])
    reference.append(ratio)
    floor.append(FLOORS["residual_variance"])
    gaps = _disagreement(exported_, reference, floor)
    gaps[-1] = torch.where(torch.isinf(ratio), NAN, gaps[-1])   # too close to the undefined threshold to call
    entropy_gap = _largest(list(_disagreement(entropy_exported, entropy_reference, entropy_floor).unbind()))
    others = _largest(list(gaps.unbind()))
    return (*(torch.where(valid.any(), x, NAN) for x in (entropy_gap, others)), per_dimension)


def update_disagreement(dist, clip: float, kept: KeptSteps, steps: list, b, stats: dict,
                        loss_gradient_policy: torch.Tensor) -> list[torch.Tensor]:
    """KL (last epoch) and clip fraction (every step) recomputed from the kept minibatch steps (`kept`; `steps`:
    (minibatch indices, policy parameters, last epoch) per step).

    The clip fraction is the loss's own statistic: when the loss's policy gradient is off its closed form,
    the loss invariant names the fault, and the clip fraction is not held against telemetry.
    """
    distance = ((kept.log_ratio.exp() - 1).abs() - clip)
    per_step = lambda x: (kept.per_step(x) / kept.sizes.clamp_min(1)).mean()   # noqa: E731
    clip_fraction = per_step(distance > 0)
    # A sample within float32's rounding of the clip boundary may fall either side in the learner's float32
    # ratio: the share of such samples is slack, not a disagreement.
    slack = per_step(distance.abs() < CLIP_BOUNDARY)
    last_mbs = torch.cat([mb for mb, _, last in steps if last])
    last_params = torch.cat([p for _, p, last in steps if last])
    kl = _kl(dist, b.mb_params[last_mbs], last_params).sum() / max(b.count, 1)
    exported_clip = stats["clip_fraction"].to(F64)
    beyond_slack = torch.where((exported_clip - clip_fraction).abs() <= slack, clip_fraction, exported_clip)
    clip_gap, kl_gap = _disagreement([beyond_slack, stats["kl"]], [clip_fraction, kl],
                                     [FLOORS["clip_fraction"], FLOORS["kl"]])
    return [torch.where(loss_gradient_policy > LOSS_GRADIENT_TOLERANCE, NAN, clip_gap), kl_gap]


class StepStatistics:
    """Every optimizer step's exported statistics, recomputed in float64 (sampled updates): the gradient norm before
    the clip over every step, and over the first epoch its abs-max, its mean square and each output head's norm,
    from the parameters' own `.grad` (not the learner's flat view of them); the value loss from the steps' values
    and the returns' targets; the entropy term from the steps' policy parameters (KeptSteps). Each step keeps its
    gradient and values as they are; everything is computed at once in `disagreement`."""

    def __init__(self, heads: dict[str, torch.Tensor]):
        """`heads`: each output head's positions in the parameters laid end to end (transfer.head_positions)."""
        self.heads = heads
        self.grads: list[torch.Tensor] = []
        self.first_epoch: list[bool] = []
        self.value_gaps: list[torch.Tensor] = []   # per step: values - targets

    @torch.no_grad()
    def step(self, net, values: torch.Tensor, targets: torch.Tensor, first_epoch: bool) -> None:
        self.grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                     for p in net.parameters()]))
        self.first_epoch.append(first_epoch)
        self.value_gaps.append(values.detach().to(F64) - targets.to(F64))

    def disagreement(self, stats: dict, dist, kept, value_off: torch.Tensor,
                     entropy_off: torch.Tensor) -> torch.Tensor:
        """The largest relative gap of the exported step statistics to the recomputed ones; a loss term whose
        own gradient is off its closed form (`value_off`, `entropy_off`) is that loss's fault, not judged here."""
        if not self.grads or kept is None:
            return NAN
        g = torch.stack(self.grads).to(F64)                                   # [steps, parameters]
        first = g[torch.tensor(self.first_epoch, device=g.device)]
        exported = [stats["grad_norm"], stats["grad_absmax"], stats["grad_meansq"]]
        reference = [g.norm(dim=1).mean(), first.abs().amax(), first.pow(2).mean()]
        for name, at in self.heads.items():
            exported.append(stats[f"grad_norm_{name}"])
            reference.append(first[:, at].norm(dim=1).mean())
        gaps = list(_disagreement(exported, reference, [GRADIENT_FLOOR] * len(exported)).unbind())
        squared = torch.cat(self.value_gaps).pow(2)   # laid end to end as the kept steps are
        value_loss = 0.5 * (kept.per_step(squared) / kept.sizes.clamp_min(1)).mean()
        entropy_loss = -(kept.per_step(_entropy(dist, kept.params)) / kept.sizes.clamp_min(1)).mean()
        value, entropy = _disagreement([stats["value_loss"], stats["entropy_loss"]], [value_loss, entropy_loss],
                                       [SPREAD_FLOOR * 1e-3, FLOORS["relative_entropy"]]).unbind()
        gaps += [torch.where(value_off, NAN, value), torch.where(entropy_off, NAN, entropy)]
        return _largest(gaps)
