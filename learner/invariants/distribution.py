"""The action distribution's formulas against torch.distributions: the stage that actor and learner share.

distribution_as_defined (policy). On sampled updates, the product's
log-probability of each behaviour action and entropy (learner/networks.py:
the formulas the actor records with and the learner trains with) are
recomputed from the same parameters by `torch.distributions` in float64
(Categorical from logits; a diagonal Normal from [mean, log std]). Statistic:
the largest |product - reference| / max(|reference|, 1 nat) over the batch's
valid samples and both quantities, on the learner's parameters and a wider
copy (logits and means x4, every parameter
nudged by +-0.25, within +-6): a near-uniform policy at initialisation hides
a wrong temperature. The distribution's KL is not judged here: PPO's loss does
not use it, only the exported KL diagnostic does, and telemetry_recomputed
holds that to its own reference. A shared formula that is wrong agrees
with itself everywhere else (the actor's record and the learner's replay match),
so only an independent reference can see it, and the fault is the formula's,
not the actor's that records with it nor the telemetry's that reports it.
float32 against float64 differs by about 1e-6 of the larger of the value and
1 nat: limit 1e-3 (exact: no false alarm).
"""

from __future__ import annotations

import torch
from torch import distributions as td

from ..networks import Categorical
from .common import F64, NAN, _split

DISTRIBUTION_TOLERANCE = 1e-3
"""distribution_as_defined's limit (telemetry.invariants, which the learner may not import)."""


def _reference(dist, params: torch.Tensor) -> td.Distribution:
    params = params.detach().to(F64)
    # No argument validation: it costs more than the reference itself, and the parameters are the product's.
    if isinstance(dist, Categorical):
        return td.Categorical(logits=params, validate_args=False)
    mean, log_std = _split(params)
    return td.Independent(td.Normal(mean, log_std.exp(), validate_args=False), 1, validate_args=False)


def _gap(product: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    product, reference = product.detach().to(F64), reference.to(F64)
    gap = (product - reference).abs() / reference.abs().clamp_min(1.0)
    return torch.where(product == reference, 0.0, gap.nan_to_num(nan=1.0, posinf=1.0)).amax()


def distribution_error(dist, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """inv_distribution_as_defined on flat valid samples: params [n, P] of the learner at arrival and the behaviour
    actions; NaN when there is no sample."""
    if params.shape[0] == 0:
        return torch.full((), NAN, dtype=F64, device=params.device)
    # Besides the learner's own parameters, the formula is held to the reference on a wider copy of them: logits
    # and means magnified, every parameter nudged by +-0.25 (kept within +-6). At initialisation the policy is
    # near uniform, where a wrong temperature or a wrong spread term barely shows.
    # The reference holds for any parameters, so the wider copy adds sensitivity and no false alarm.
    nudge = 0.25 * (1 - 2 * (torch.arange(params.shape[-1], device=params.device) % 2)).to(params.dtype)
    wide = (4 * torch.roll(params, 1, 0) + nudge).clamp(-6.0, 6.0)
    reference_actions = actions.long() if isinstance(dist, Categorical) else actions.to(F64)
    gaps = []
    for p in (params, wide):
        ref = _reference(dist, p)
        gaps += [_gap(dist.log_prob(p, actions), ref.log_prob(reference_actions)), _gap(dist.entropy(p), ref.entropy())]
    return torch.stack(gaps).amax()
