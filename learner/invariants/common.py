"""What the learner's invariant families share: the float64 distributions (written here, apart from the code
they check), the few constants more than one family uses, and how statistics are combined."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from ..networks import Categorical

NAN = float("nan")
F64 = torch.float64
SPREAD_FLOOR = 0.01
"""A spread is judged against at least this share of its scale (advantages against targets, means and stds)."""
LOSS_GRADIENT_TOLERANCE = 0.05
"""The loss_gradient invariants' limit (telemetry.invariants, which the learner may not import)."""


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


def _relative_error_of(error: torch.Tensor, actual_norm: torch.Tensor, reference_norm: torch.Tensor) -> torch.Tensor:
    """error / ||reference||; NaN when both norms are 0 (norms are never negative)."""
    return torch.where(actual_norm + reference_norm <= 1e-30, NAN, error / reference_norm.clamp_min(1e-30))


@dataclass(frozen=True)
class KeptSteps:
    """A sampled update's minibatch steps laid end to end, for the checks that read every step: each kept sample's
    position in the batch, the step it belongs to, each step's size, and log pi_step(a) - log mu(a) in float64
    (pi_step: the policy as that step saw it)."""

    positions: torch.Tensor
    step_of: torch.Tensor
    sizes: torch.Tensor
    log_ratio: torch.Tensor
    params: torch.Tensor
    """Each kept sample's policy parameters as its step saw them."""

    @classmethod
    def of(cls, dist, steps: list, actions: torch.Tensor, behaviour_logp: torch.Tensor) -> KeptSteps:
        """From the kept `steps` ((minibatch positions, policy parameters, last epoch) per step)."""
        positions = torch.cat([mb for mb, _, _ in steps])
        # Built on the host and sent without waiting: the device's queue is never drained here.
        host_sizes = torch.tensor([mb.numel() for mb, _, _ in steps])
        step_of = torch.repeat_interleave(torch.arange(len(steps)), host_sizes).to(positions.device, non_blocking=True)
        params = torch.cat([p for _, p, _ in steps])
        log_ratio = _log_prob(dist, params, actions[positions]) - behaviour_logp[positions].to(F64)
        return cls(positions, step_of, host_sizes.to(positions.device, F64, non_blocking=True), log_ratio, params)

    def per_step(self, x: torch.Tensor) -> torch.Tensor:
        """Each step's sum of `x` (one value per kept sample)."""
        return torch.zeros(self.sizes.numel(), dtype=F64, device=x.device).index_add_(0, self.step_of, x.to(F64))
