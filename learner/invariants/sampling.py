"""Sampling (the actor's record): the actions in a batch are draws of the behaviour distribution the actor
recorded for them.

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
(1/36)^3 = 2e-5. Measured on sampled updates (hooks.is_sampled). The Gaussian
check is for the unsquashed draw, which is what a rollout stores: the runner
clips only the copy of the action it sends the env.

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
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..networks import Categorical
from .common import F64, _nan_like, _split

TAU = 1e-3
"""Nats of float32 rounding allowed per recorded log-probability."""


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


PAIRED_ELSEWHERE = 0.01
"""A neighbouring step's observation explains the disagreement when it leaves under this share of it."""


def observation_pairing(plain: float, shifted: float) -> dict[str, float]:
    """Split `logp_discrepancy` (learner/diagnostics.py) between the two invariants it can break.

    With the weights that acted, the learner's log-probability of each behaviour action disagrees with the
    actor's (`plain`). If the learner's value at a neighbouring step's observation agrees (`shifted` under
    PAIRED_ELSEWHERE of `plain`), the actor acted on another step's observation than the one stored with the
    action (`inv_acted_on_stored_observation`, the actor's); otherwise the learner reads the same observation
    differently (`inv_learner_sees_actor_data`, preprocessing). NaN stays NaN (not measured)."""
    if plain != plain:
        return {"inv_learner_sees_actor_data": plain, "inv_acted_on_stored_observation": plain}
    paired_elsewhere = shifted == shifted and shifted <= PAIRED_ELSEWHERE * plain
    return {"inv_learner_sees_actor_data": 0.0 if paired_elsewhere else plain,
            "inv_acted_on_stored_observation": plain if paired_elsewhere else 0.0}
