"""Observation normalisation and reward scaling by running statistics (both off unless the config asks).

`ObservationNormalizer` is a module of the network: its statistics are buffers, so
they travel with the weights (Ray publishes, checkpoints, eval) stamped with the
same age, and the actors and the learner normalise with the same numbers.
`LearnerNormalization` is the learner's side: it scales a batch's rewards by the
running spread of the discounted return before the targets are computed, and
updates the observation statistics after the batch's gradient update, so the
batch is learned with the statistics its actors acted with.
"""

from __future__ import annotations

import torch
from torch import nn

EPSILON = 1e-8
"""Added to variances before the square root (as SB3's VecNormalize): a constant input stays finite."""

SAFE_LIMIT = 1e30
"""Observations beyond this magnitude (the runner's SAFE_OBS_LIMIT) never enter the statistics."""


def merge_moments(count, mean, var, batch_count, batch_mean, batch_var):
    """Chan et al.'s parallel merge of (count, mean, population variance); float64 tensors.

    A batch of no samples leaves the statistics as they were.
    """
    total = count + batch_count
    share = batch_count / total.clamp_min(1)
    delta = batch_mean - mean
    merged_mean = mean + delta * share
    merged_var = (var * count + batch_var * batch_count) / total.clamp_min(1) + delta.pow(2) * share * (1 - share)
    some = total > 0
    return total, torch.where(some, merged_mean, mean), torch.where(some, merged_var, var)


def masked_moments(x: torch.Tensor, keep: torch.Tensor):
    """(count, mean, population variance) over dim 0 of x [B, ...] at the rows where keep [B] is True, in float64."""
    weight = keep.to(torch.float64).reshape(-1, *([1] * (x.dim() - 1)))
    x = torch.where(weight > 0, x.to(torch.float64), 0.0)   # excluded rows may hold inf: 0 * inf is NaN
    count = weight.sum()
    mean = (x * weight).sum(0) / count.clamp_min(1)
    var = ((x - mean).pow(2) * weight).sum(0) / count.clamp_min(1)
    return count, mean, var


class ObservationNormalizer(nn.Module):
    """(obs - running mean) / sqrt(running variance + eps), clipped to +-clip.

    The statistics start at mean 0, variance 1 and count 0; the learner merges each
    batch's moments in (`update`). They are float64 buffers (a float32 count stops
    counting at 2**24 samples); the normalisation itself runs in float32.
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0):
        super().__init__()
        self.clip = float(clip)
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mean, std = self._float32_moments()
        return ((obs.float() - mean) / std).clamp(-self.clip, self.clip)

    def _float32_moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The float32 mean and std the normalisation uses, recomputed only when a buffer changed: an actor calls
        the normaliser once per env step, and the four ops of the conversion were a tenth of its forward pass.
        Any write to a buffer (`update`, `load_state_dict`, `.to()`) bumps its version or replaces it."""
        versions = (self.mean._version, self.var._version)
        cached = self.__dict__.get("_moments")
        if cached is None or cached[0] is not self.mean or cached[1] is not self.var or cached[2] != versions:
            cached = (self.mean, self.var, versions, (self.mean.float(), torch.sqrt(self.var + EPSILON).float()))
            self.__dict__["_moments"] = cached
        return cached[3]

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        """Merge the moments of a batch of raw observations [B, *shape] (rows beyond SAFE_LIMIT or NaN left out)."""
        keep = (obs.abs() <= SAFE_LIMIT).flatten(1).all(1)
        count, mean, var = merge_moments(self.count, self.mean, self.var, *masked_moments(obs, keep))
        self.count.copy_(count)
        self.mean.copy_(mean)
        self.var.copy_(var)

    def statistics(self) -> dict[str, torch.Tensor]:
        """0-d tensors: samples seen, and the mean over dimensions of |mean| and of std."""
        return {"obs_norm_samples": self.count.float(), "obs_norm_abs_mean": self.mean.abs().mean().float(),
                "obs_norm_std": torch.sqrt(self.var + EPSILON).mean().float()}


class ReturnScaler:
    """Rewards divided by the running std of the discounted return, clipped to +-clip (SB3's VecNormalize).

    Each env's running discounted return (reset at every episode end) is kept by the
    runner, which sees every step of its envs in order, and arrives with the rollout;
    the running variance over all of them lives here, in float64 on the learner's device.
    """

    def __init__(self, device: torch.device, clip: float = 10.0):
        self.clip = float(clip)
        self.count = torch.zeros((), dtype=torch.float64, device=device)
        self.mean = torch.zeros((), dtype=torch.float64, device=device)
        self.var = torch.ones((), dtype=torch.float64, device=device)

    def divisor(self) -> torch.Tensor:
        return torch.sqrt(self.var + EPSILON)

    def scale(self, rewards: torch.Tensor, returns: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Merge the batch's returns at its valid steps into the statistics, then scale its rewards with them."""
        returns = returns.reshape(-1)   # a NaN reward's return stays NaN until its episode ends: left out
        moments = masked_moments(returns, valid.reshape(-1) & torch.isfinite(returns))
        self.count, self.mean, self.var = merge_moments(self.count, self.mean, self.var, *moments)
        return (rewards / self.divisor()).clamp(-self.clip, self.clip).to(rewards.dtype)

    def state(self) -> dict[str, torch.Tensor]:
        return {"count": self.count.cpu(), "mean": self.mean.cpu(), "var": self.var.cpu()}

    def load_state(self, state: dict) -> None:
        device = self.count.device
        self.count, self.mean, self.var = (state[k].to(device, torch.float64) for k in ("count", "mean", "var"))


class LearnerNormalization:
    """What the learner does about both, around one batch; a skipped batch is undone from both."""

    def __init__(self, net: nn.Module, normalize_rewards: bool, clip: float, device: torch.device):
        self.observations: ObservationNormalizer | None = getattr(net, "obs_normalizer", None)
        self.returns = ReturnScaler(device, clip) if normalize_rewards else None
        self.device = device
        self._saved: tuple = ()

    def scale_rewards(self, tensors: dict) -> None:
        """Before the targets: the batch's rewards (in `tensors`, on the device) scaled in place of the raw ones."""
        # No host copy (that would wait for the device): buffers change in place, the scaler's tensors are replaced.
        self._saved = (tuple(b.clone() for b in self.observations.buffers()) if self.observations else (),
                       (self.returns.count, self.returns.mean, self.returns.var) if self.returns else None)
        returns = tensors.pop("discounted_returns", None)
        if self.returns is None:
            return
        if returns is None:
            raise ValueError("normalize_rewards is on but the rollout has no discounted returns: "
                             "its runner was built without return_discount")
        tensors["rewards"] = self.returns.scale(tensors["rewards"], returns, tensors["valid"])

    def update_observations(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """After the gradient update: merge the batch's raw observations; every statistic of both, as 0-d tensors."""
        if self.observations is not None:
            self.observations.update(obs)
            stats = self.observations.statistics()
        else:   # off: the identity, said as such (0 samples, mean 0, std 1)
            zero = torch.zeros((), device=self.device)
            stats = {"obs_norm_samples": zero, "obs_norm_abs_mean": zero, "obs_norm_std": zero + 1}
        stats["reward_divisor"] = (self.returns.divisor().float() if self.returns is not None
                                   else torch.ones((), device=self.device))
        return stats

    def undo(self) -> None:
        """Put both back as they were before the batch (its update went non-finite and was undone)."""
        buffers, returns = self._saved
        for live, saved in zip(self.observations.buffers() if self.observations else (), buffers, strict=True):
            live.copy_(saved)
        if returns is not None:
            self.returns.count, self.returns.mean, self.returns.var = returns

    def state(self) -> dict:
        """For the checkpoint (the observation statistics are in the network's own state)."""
        return {"returns": self.returns.state()} if self.returns is not None else {}

    def load_state(self, state: dict) -> None:
        if self.returns is not None and "returns" in state:
            self.returns.load_state(state["returns"])
