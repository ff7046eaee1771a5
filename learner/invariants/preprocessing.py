"""The declared preprocessing re-derived from the raw stream: the running observation statistics and the
reward scaling.

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

reward_scaling_recomputed (preprocessing). With reward normalisation on, the
rewards the returns are computed from must be the raw rewards divided by
sqrt(var' + 1e-8) and clipped to +-clip, where var' is the running variance of
the discounted returns before the batch merged (as above, float64, written
apart) with the batch's discounted returns at its valid steps (non-finite ones
left out). Statistic: max |scaled - reference| / max(max |reference|, 1e-8)
over the valid steps; float32 rounding of one division, about 1e-7: limit 1e-4.
A divisor from other statistics (the rewards' own spread, a stale or never
updated variance, the returns before the merge), another clip or a scaling
applied twice breaks it.

running_returns_recomputed (actor). The discounted returns the actor carries
for that scaling follow, env by env, from the raw rewards and episode ends:
at every step t >= 1 of a rollout, R_t = gamma R_{t-1} + r_t on a valid step
(R_{t-1} taken as 0 when the episode ended at t-1), R_t = R_{t-1} on a reset
transition. The actor keeps R in float64 and stores it in float32, so the
recursion on the stored values differs by float32 rounding, about 1e-7 of the
returns' scale. Statistic: max |R_t - reference_t| / max(max |R|, 1e-8) over
t >= 1 (the first step's carry comes from the previous rollout); limit 1e-5.
A return not reset at episode ends, another discount, or returns of other
rewards than those stored break it.
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


def _merged(before, x: torch.Tensor, keep: torch.Tensor):
    """(n', mean', var') of the statistics `before` = (n, m, v) (m, v of shape [d]) merged with the rows of
    x [k, d] where keep [k] is True, in float64, shifted by m; masked sums, so nothing waits for the device."""
    n, m, v = (t.to(F64).reshape(-1) if t.dim() else t.to(F64) for t in before)
    d = torch.where(keep.unsqueeze(1), x.to(F64) - m.reshape(1, -1), 0.0)
    n1 = n + keep.to(F64).sum()
    s1, s2 = d.sum(0), d.pow(2).sum(0)
    mean = m.reshape(-1) + s1 / n1.clamp_min(1)
    var = (n * v.reshape(-1) + s2 - s1.pow(2) / n1.clamp_min(1)) / n1.clamp_min(1)
    return n1, torch.where(n1 > 0, mean, m.reshape(-1)), torch.where(n1 > 0, var, v.reshape(-1))


def statistics_error(normalizer, before, raw_obs: torch.Tensor) -> torch.Tensor:
    """inv_observation_statistics_recomputed: the normaliser's statistics now against `before` merged with the
    raw observations `raw_obs` [k, *shape] of the batch (valid steps); NaN without a normaliser."""
    if normalizer is None or before is None:
        return torch.full((), NAN, dtype=F64, device=raw_obs.device)
    x = raw_obs.to(F64).reshape(raw_obs.shape[0], -1)
    n1, mean, var = _merged(before, x, (torch.isfinite(x) & (x.abs() <= SAFE_LIMIT)).all(1))
    got_n, got_mean, got_var = (t.detach().to(F64).reshape(-1) for t in (normalizer.count, normalizer.mean,
                                                                        normalizer.var))
    if got_mean.shape != mean.shape:
        return torch.ones((), dtype=F64, device=raw_obs.device)
    spread = (var + 1e-8).sqrt()
    gaps = torch.stack([((got_n - n1).abs() / n1.clamp_min(1)).reshape(()),
                        ((got_mean - mean).abs() / spread).amax(),
                        ((got_var - var).abs() / (var + 1e-8)).amax()])
    return gaps.nan_to_num(nan=1.0).amax()


def scaling_error(before, raw_rewards: torch.Tensor, returns: torch.Tensor, valid: torch.Tensor,
                  scaled: torch.Tensor, clip: float) -> torch.Tensor:
    """inv_reward_scaling_recomputed: the scaled rewards against the raw ones over the divisor recomputed from the
    scaler's statistics `before` (count, mean, var) and the batch's discounted returns; NaN without valid steps."""
    returns = returns.reshape(-1, 1).to(F64)
    _, _, variance = _merged(before, returns, valid.reshape(-1) & torch.isfinite(returns[:, 0]))
    reference = (raw_rewards.to(F64) / (variance[0] + 1e-8).sqrt()).clamp(-clip, clip)
    mask = valid & torch.isfinite(reference)
    gap = torch.where(mask, (scaled.to(F64) - reference).abs(), 0.0).amax()
    scale = torch.where(mask, reference.abs(), 0.0).amax().clamp_min(1e-8)
    # No valid step: not measured (read on the device, no host sync).
    return torch.where(mask.any(), (gap / scale).nan_to_num(nan=1.0), NAN)


def running_return_error(returns: torch.Tensor, rewards: torch.Tensor, terminated: torch.Tensor,
                         truncated: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """inv_running_returns_recomputed on a [T, N] rollout (module docstring); NaN for a one-step rollout."""
    R, r = returns.to(F64), rewards.to(F64)
    if R.shape[0] < 2:
        return torch.full((), NAN, dtype=F64, device=R.device)
    ended = (terminated | truncated) & valid
    carried = torch.where(ended[:-1], 0.0, R[:-1])
    reference = torch.where(valid[1:], gamma * carried + r[1:], carried)
    scale = R.abs().amax().clamp_min(1e-8)
    return ((R[1:] - reference).abs().amax() / scale).nan_to_num(nan=1.0)
