"""Moving a batch between the host and the learner's device, and its statistics back in one transfer."""

from __future__ import annotations

import torch
from torch import nn

from rlvitals.actors.rollout import Rollout


def head_positions(net: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """Where each output head's own parameters lie in diag.flat_grads(net): their gradient norm, before
    clipping, is then one index_select per head (a parameter without a gradient is zeros there)."""
    if not hasattr(net, "heads"):
        return {}
    where, start = {}, 0
    for p in net.parameters():
        where[id(p)] = torch.arange(start, start + p.numel())
        start += p.numel()
    return {head: torch.cat([where[id(p)] for p in params]).to(device) for head, params in net.heads().items()}


def transferred(rollout: Rollout) -> tuple[str, ...]:
    """The rollout's tensors the learner copies to its device."""
    names = ("obs", "actions", "rewards", "terminated", "truncated", "valid", "behaviour_params", "behaviour_logp")
    optional = ("discounted_returns", "initial_state", "initial_starts")   # reward scaling, a recurrent policy
    return names + tuple(k for k in optional if getattr(rollout, k) is not None)


def pin_rollout(rollout: Rollout, device: torch.device) -> Rollout:
    """For a CUDA learner: the rollout's tensors moved into pinned host memory, so `learn` only queues
    asynchronous copies. Meant for whoever fetches rollouts off the learner's thread (Ray mode's
    background fetch); elsewhere, or on a CPU learner, the rollout is returned as it is."""
    if device.type == "cuda":
        for name in transferred(rollout):
            tensor = getattr(rollout, name)
            if tensor.device.type == "cpu" and not tensor.is_pinned():
                setattr(rollout, name, tensor.pin_memory())
    return rollout


def to_device(x: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """Host tensor to the learner's device: on CUDA through pinned memory, so the copy is asynchronous."""
    if dev.type == "cuda" and x.device.type == "cpu" and not x.is_pinned():
        x = x.pin_memory()
    return x.to(dev, non_blocking=True)


def first_nonfinite(host: dict) -> str:
    """Where non-finite values first showed up in an update ('' when everything was finite)."""
    for flag, where in (("loss_finite", "loss"), ("grads_finite", "gradients"), ("params_finite", "weights")):
        if host[flag] < 1:
            return where
    return ""


def to_host(scalars: dict, vectors: dict) -> dict:
    """Copy every statistic of the batch to the host in one transfer."""
    names = list(scalars)
    parts = [torch.stack([scalars[k].float() for k in names])] + [v.float().reshape(-1) for v in vectors.values()]
    host = torch.cat(parts).tolist()
    out = dict(zip(names, host[: len(names)], strict=True))
    offset = len(names)
    for key, v in vectors.items():
        out[key] = host[offset: offset + v.numel()]
        offset += v.numel()
    for key in ("target_hist", "advantage_hist"):
        if key in out:
            out[key] = (out[key], out.pop(f"{key}_sum"))
    return out
