"""Per-batch learning diagnostics, computed on the learner's device.

Every function returns 0-d tensors so the learner can stack all of them and
copy them to the host once per batch. Statistics that are undefined for a
batch (a correlation with fewer than two terminal steps, a variance of a
constant) come back as NaN and are skipped by the exporters, never shown as 0.
"""

from __future__ import annotations

import torch

NAN = float("nan")


def _nan(ref: torch.Tensor) -> torch.Tensor:
    return torch.full((), NAN, device=ref.device)


SUMMARY_STATS = ("min", "max", "mean", "std")


def summaries(named: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """min, max, mean and std where mask holds of each tensor in `named` (all of mask's shape), as
    `{name}_{stat}`; NaN when the mask is empty.

    The tensors are stacked and summarised together: a fixed dozen operations however many there are.
    Masks instead of boolean indexing: indexing would force a device sync.
    """
    x = torch.stack([t.float() for t in named.values()]).flatten(1)       # [k, T * N]
    keep = mask.reshape(1, -1)
    m = keep.float()
    n = m.sum()
    mean = (x * m).sum(1, keepdim=True) / n.clamp_min(1)
    std = (((x - mean) * m).pow(2).sum(1, keepdim=True) / n.clamp_min(1)).sqrt()
    table = torch.cat([torch.where(keep, x, torch.inf).amin(1, keepdim=True),
                       torch.where(keep, x, -torch.inf).amax(1, keepdim=True), mean, std], 1)   # [k, 4]
    table = torch.where(n < 1, NAN, table)
    keys = [f"{name}_{stat}" for name in named for stat in SUMMARY_STATS]
    return dict(zip(keys, table.reshape(-1).unbind(), strict=True))


def _masked_moments(x, y, mask):
    m = mask.float()
    n = m.sum().clamp_min(1)
    xc = (x - (x * m).sum() / n) * m
    yc = (y - (y * m).sum() / n) * m
    return xc, yc, m.sum()


def residual_variance(targets: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                      min_std: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Var(targets - values) / Var(targets): 1 = the value net explains nothing, 0 = everything.

    NaN (undefined) when std(targets) < min_std: a ratio over nearly constant targets
    measures the value net's noise, not what it explains.
    """
    tc, rc, n = _masked_moments(targets, targets - values, mask)
    var_t, var_r = tc.pow(2).sum(), rc.pow(2).sum()
    spread = (var_t > 1e-12) & (var_t >= n.clamp_min(1) * torch.as_tensor(min_std, device=targets.device) ** 2)
    return torch.where(spread, var_r / var_t.clamp_min(1e-12), _nan(targets))


def correlation(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Pearson correlation where mask holds; NaN with fewer than two points or a constant input."""
    xc, yc, n = _masked_moments(x.float(), y.float(), mask)
    denom = (xc.pow(2).sum() * yc.pow(2).sum()).sqrt()
    ok = (n >= 2) & (denom > 1e-12)
    return torch.where(ok, (xc * yc).sum() / denom.clamp_min(1e-12), _nan(x))


def terminal_correlations(values, rewards, terminated, valid, done):
    """corr(V(s_final), r_final) and corr(V(s_penultimate), r_final) over terminal steps in the batch.

    A healthy value net predicts the final reward from the last state (near 1);
    a high terminal but low penultimate correlation means reward-to-go is not
    carried backwards.
    """
    final = terminated & valid
    terminal = correlation(values, rewards, final)
    # The penultimate step must be a real step of the same episode.
    penultimate_ok = final[1:] & valid[:-1] & ~done[:-1]
    penultimate = correlation(values[:-1], rewards[1:], penultimate_ok)
    return terminal, penultimate


def logp_discrepancy(dist, params_all: torch.Tensor, actions: torch.Tensor, behaviour_logp: torch.Tensor,
                     valid: torch.Tensor, log_rhos: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Actor-learner consistency, for a batch the learner sees with the weights that acted.

    `params_all` [T+1, N, P]: the learner's policy parameters for obs[0..T]. Returns the
    largest |log pi(a_t|x_t) - log mu_t| over valid steps t, and the same with the
    learner's x_{t-1} or x_{t+1} in place of x_t (the smaller of the two shifts; steps
    whose neighbouring observation lies in the rollout). Healthy: 0 and clearly above 0.
    Observations stored one step off their actions: above 0 and 0. The learner seeing
    different observations than the actor: both above 0. NaN where no step qualifies. `log_rhos`, when the
    caller has it: log pi(a_t|x_t) - log mu_t, the unshifted gap.
    """
    T = actions.shape[0]

    def worst_of(gap, mask):   # -inf when no step qualifies
        if mask.numel() == 0:
            return torch.full((), -torch.inf, device=params_all.device)
        return torch.where(mask, gap.abs(), -torch.inf).amax()

    def worst(params, acts, logp, mask):
        if mask.numel() == 0:   # a one-step rollout has no neighbouring observation: nothing to compare
            return worst_of(logp, mask)
        return worst_of(dist.log_prob(params, acts) - logp, mask)

    plain = worst(params_all[:T], actions, behaviour_logp, valid) if log_rhos is None else worst_of(log_rhos, valid)
    earlier = worst(params_all[: T - 1], actions[1:], behaviour_logp[1:], valid[1:])   # learner reads x_{t-1}
    later = worst(params_all[1:], actions, behaviour_logp, valid)                       # learner reads x_{t+1}
    none = lambda x: torch.where(x < 0, torch.inf, x)  # noqa: E731  (an empty side never wins the min)
    shifted = torch.minimum(none(earlier), none(later))
    return torch.where(plain < 0, NAN, plain), torch.where(torch.isinf(shifted), NAN, shifted)


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def flat_grads(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in module.parameters()])


def step_statistics(before: torch.Tensor, after: torch.Tensor) -> dict[str, torch.Tensor]:
    """abs-max and mean-square of the parameter change made by one learner update."""
    delta = after - before
    return {"step_absmax": delta.abs().max(), "step_meansq": delta.pow(2).mean()}


class GradientNoiseScale:
    """McCandlish & Kaplan's simple noise scale B = tr(Sigma) / |G|^2, from two batch sizes.

    |G_small|^2 is the mean squared norm of minibatch gradients and |G_big|^2 the
    squared norm of their mean. Both unbiased estimates are averaged with an EMA
    before dividing, because the per-batch ratio is notoriously noisy.
    """

    def __init__(self, decay: float = 0.95):
        self.decay = decay
        self.trace_ema = None
        self.sqnorm_ema = None

    def update(self, small_sqnorm: torch.Tensor, big_sqnorm: torch.Tensor, b_small: float,
               b_big: float) -> torch.Tensor:
        if b_big <= b_small:
            return torch.tensor(NAN, device=small_sqnorm.device)
        g2 = (b_big * big_sqnorm - b_small * small_sqnorm) / (b_big - b_small)
        trace = (small_sqnorm - big_sqnorm) / (1.0 / b_small - 1.0 / b_big)
        if self.trace_ema is None:
            self.trace_ema, self.sqnorm_ema = trace, g2
        else:
            d = self.decay
            self.trace_ema = d * self.trace_ema + (1 - d) * trace
            self.sqnorm_ema = d * self.sqnorm_ema + (1 - d) * g2
        return torch.where(self.sqnorm_ema > 0, self.trace_ema / self.sqnorm_ema.clamp_min(1e-20),
                           torch.tensor(NAN, device=small_sqnorm.device))


def bucket_counts(x: torch.Tensor, mask: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """Counts per Prometheus bucket (x <= bound; last entry: above every bound) of x where mask holds."""
    index = torch.bucketize(x.reshape(-1).float(), bounds, right=False)
    return torch.bincount(index, weights=mask.reshape(-1).float(), minlength=bounds.numel() + 1)


class ActivationProbe:
    """Forward hooks on activation layers that keep each layer's output for one forward pass."""

    def __init__(self, net: torch.nn.Module, enabled: bool):
        self.net, self.enabled = net, enabled
        self.outputs: dict[str, tuple[str, torch.Tensor]] = {}
        self.handles = []

    def __enter__(self):
        if self.enabled:
            for name, module in self.net.named_modules():
                if isinstance(module, (torch.nn.ReLU, torch.nn.Tanh)):
                    kind = "relu" if isinstance(module, torch.nn.ReLU) else "tanh"
                    self.handles.append(module.register_forward_hook(
                        lambda m, i, o, name=name, kind=kind: self.outputs.__setitem__(name, (kind, o.detach()))))
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles = []


def layer_statistics(net: torch.nn.Module, probe: ActivationProbe) -> dict[str, torch.Tensor]:
    """Per-layer weight and gradient RMS, activation std and dead-unit fraction (debug level)."""
    out: dict[str, torch.Tensor] = {}
    for name, module in net.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
            out[f"layer_weight_rms/{name}"] = module.weight.detach().pow(2).mean().sqrt()
            grad = module.weight.grad   # None: no gradient ever reached it, which reads 0 like a zero one
            out[f"layer_gradient_rms/{name}"] = (grad.pow(2).mean().sqrt() if grad is not None
                                                 else torch.zeros((), device=module.weight.device))
    for name, (kind, act) in probe.outputs.items():
        units = act.reshape(act.shape[0], -1)
        out[f"layer_activation_std/{name}"] = units.std(unbiased=False)
        inactive = units <= 0 if kind == "relu" else units.abs() > 0.99
        out[f"layer_dead_ratio/{name}"] = inactive.all(0).float().mean()
    return out


def loss_directions(logp, values, entropy, advantages, targets, normalize_advantages: bool,
                    value_bias: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Which way the loss pulls each output, read from its gradients after `backward()`.

    `logp`, `values` and `entropy` are the network's outputs the loss was built
    from, with `retain_grad()` called before the backward pass; `advantages` and
    `targets` are what the learner computed for them. Whatever the loss's
    formula, a correct one obeys, sample by sample:
      * the policy is pushed towards actions with above-average advantage:
        -dL/dlogp_i * a_i >= 0, with a_i the advantage centred as the loss
        normalises it (clipped samples contribute 0);
      * values are pulled towards their targets: dL/dV_i * (V_i - t_i) >= 0;
      * the entropy bonus rewards entropy: -sum_i dL/dH_i = entropy_coef >= 0.
    Reported scale-free (a healthy push reads about 1 - the clip fraction, a
    healthy pull the value coefficient), so a negative reading is a sign error in
    the loss, whatever the env: a flipped advantage or ratio, a value loss that
    ascends, an entropy bonus subtracted.

    `value_bias`: the value head's bias, which is added to every value, so its
    gradient must be sum_i dL/dV_i. `gradient_mismatch` is the difference as a
    fraction of sum_i |dL/dV_i| (0 when the loss does not reach V): rounding
    when healthy, of order 1 when the gradient the optimizer steps with is not
    this loss's (gradients that accumulate across steps, a stray write to .grad).
    """
    n = logp.numel()
    a = (advantages - advantages.mean()) if normalize_advantages and n > 1 else advantages
    a, err = a.detach().float(), (values - targets).detach().float()
    push = -n * (_grad(logp) * a).sum() / a.pow(2).sum()
    pull = n * (_grad(values) * err).sum() / err.pow(2).sum()
    out = {"policy_loss_direction": push, "value_loss_direction": pull,   # 0/0 (nothing to push or pull): NaN
           "entropy_loss_direction": -_grad(entropy).sum()}
    if value_bias is not None:
        dv = _grad(values)
        bias_grad = _grad(value_bias).sum()
        out["gradient_mismatch"] = (bias_grad - dv.sum()).abs() / dv.abs().sum().clamp_min(1e-30)
    return out


def record_discrepancy(dist, behaviour_params: torch.Tensor, actions: torch.Tensor, behaviour_logp: torch.Tensor,
                       valid: torch.Tensor) -> torch.Tensor:
    """The actor's record against itself: max |log mu(a_t; its stored parameters) - its stored log mu_t|.

    Needs no learner network, so it holds at any staleness: the actor computed the
    log-probability from those parameters for that action. Healthy: 0 up to rounding.
    Above it, the stored actions are not the ones acted with (or not the ones the
    log-probabilities belong to). NaN when no step is valid.
    """
    gap = (dist.log_prob(behaviour_params.float(), actions) - behaviour_logp.float()).abs()
    worst = torch.where(valid, gap, -torch.inf).amax()
    return torch.where(torch.isinf(worst), NAN, worst)


def _grad(output: torch.Tensor) -> torch.Tensor:
    """dL/d(output); zeros where the loss does not reach it (a detached output: other rules say so)."""
    return output.grad.float() if output.grad is not None else torch.zeros_like(output, dtype=torch.float32)


SATURATED_SIGMOID, SATURATED_TANH = 4.6, 2.65
"""|pre-activation| beyond which a sigmoid gate is within 0.01 of 0 or 1, and tanh within 0.01 of -1 or 1."""


def recurrent_statistics(net, sequences) -> dict[str, torch.Tensor]:
    """The policy core's hidden state and gates (debug level): the RMS of the state each env's sequence began with
    (emptied where its first step begins an episode), and the share of gate units saturated at that first step.
    A state RMS near 0 after training carries nothing forward; gates saturated near 1 freeze the state and stop
    the gradient through time."""
    lstm = net.cores[0].lstm
    h = sequences.state[:, 0] * (~sequences.starts[0]).to(sequences.state.dtype).unsqueeze(-1)
    x = net.policy_intake(net.normalized(sequences.obs[0]))
    pre = x @ lstm.weight_ih_l0.t() + lstm.bias_ih_l0 + h @ lstm.weight_hh_l0.t() + lstm.bias_hh_l0
    gate_in, forget, cell, gate_out = pre.chunk(4, dim=-1)
    saturated = torch.cat([g.abs() > SATURATED_SIGMOID for g in (gate_in, forget, gate_out)]
                          + [cell.abs() > SATURATED_TANH], -1)
    return {"recurrent_state_rms": h.pow(2).mean().sqrt(), "recurrent_gate_saturated_ratio": saturated.float().mean()}
