"""The declared preprocessing re-derived from the raw stream: the running observation statistics.

observation_statistics_recomputed (preprocessing). With observation
normalisation on, the normaliser's running count, mean and variance after a
batch must be its statistics before the batch merged with the moments of the
batch's raw observations: the valid steps of the rollout as it arrived (rows
with a non-finite or beyond-1e30 entry left out, as declared). The reference,
written here apart from `normalize.merge_moments`, shifts by the previous mean
in float64:
    n' = n + k,   mean' = m + S1 / n',   var' = (n v + S2 - S1^2 / n') / n'
with S1 = sum_i (x_i - m) and S2 = sum_i (x_i - m)^2 over the batch's k rows.
Statistic: the largest of |n' - n'_ref| / n'_ref, |mean' - mean'_ref| /
sqrt(var'_ref + 1e-8) and |var' - var'_ref| / (var'_ref + 1e-8) over the
observation's dimensions. Both are float64 of the same sums, about 1e-12 apart:
limit 1e-6. Statistics fed other observations (normalised ones, another
batch's, a part of the batch, a stale copy) or merged with another formula
break it, while actor and learner normalise alike and every other check holds.
Measured on sampled updates where the batch was learned from.
"""

from __future__ import annotations

import torch

from .common import F64, NAN

SAFE_LIMIT = 1e30
"""Observations beyond this magnitude never enter the statistics (the declared rule)."""


def snapshot(normalizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The normaliser's (count, mean, var) before a batch, copied; None without a normaliser."""
    if normalizer is None:
        return None
    return normalizer.count.detach().clone(), normalizer.mean.detach().clone(), normalizer.var.detach().clone()


def statistics_error(normalizer, before, raw_obs: torch.Tensor) -> torch.Tensor:
    """inv_observation_statistics_recomputed: the normaliser's statistics now against `before` merged with the
    raw observations `raw_obs` [k, *shape] of the batch (valid steps); NaN without a normaliser."""
    if normalizer is None or before is None:
        return torch.full((), NAN, dtype=F64, device=raw_obs.device)
    n, m, v = (t.to(F64) for t in before)
    x = raw_obs.to(F64).reshape(raw_obs.shape[0], -1)
    keep = (torch.isfinite(x) & (x.abs() <= SAFE_LIMIT)).all(1)
    d = torch.where(keep.unsqueeze(1), x - m.reshape(1, -1), 0.0)
    k = keep.to(F64).sum()
    n1 = n + k
    s1, s2 = d.sum(0), d.pow(2).sum(0)
    mean = m.reshape(-1) + s1 / n1.clamp_min(1)
    var = (n * v.reshape(-1) + s2 - s1.pow(2) / n1.clamp_min(1)) / n1.clamp_min(1)
    mean, var = torch.where(n1 > 0, mean, m.reshape(-1)), torch.where(n1 > 0, var, v.reshape(-1))
    got_n, got_mean, got_var = (t.detach().to(F64).reshape(-1) for t in (normalizer.count, normalizer.mean,
                                                                        normalizer.var))
    if got_mean.shape != mean.shape:
        return torch.ones((), dtype=F64, device=raw_obs.device)
    spread = (var + 1e-8).sqrt()
    gaps = torch.stack([((got_n - n1).abs() / n1.clamp_min(1)).reshape(()),
                        ((got_mean - mean).abs() / spread).amax(),
                        ((got_var - var).abs() / (var + 1e-8)).amax()])
    return gaps.nan_to_num(nan=1.0).amax()
