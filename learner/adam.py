"""The learner's Adam, built one way for the learner and for its minibatch cost reference.

torch's fused Adam updates every parameter in one kernel; the default on a CPU is a loop of about ten small ops
per tensor. On the MuJoCo preset's network (two 64x64 MLPs, a dozen tensors) the fused step is about a quarter of
the looped one's time (72 vs 299 us; bench/README.md, issue 33). The update rule is the same; the rounding order
differs, within the float32 rounding the optimizer-step invariant allows (learner/invariants/optimizer_step.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def make_adam(params: Iterable[torch.nn.Parameter], learning_rate: float, betas: tuple[float, float],
              eps: float) -> torch.optim.Adam:
    """Adam over `params`, fused where their device and dtype have the kernel, looped otherwise."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=learning_rate, betas=betas, eps=eps, fused=True)
    except (RuntimeError, ValueError):   # a device or dtype torch has no fused kernel for
        return torch.optim.Adam(params, lr=learning_rate, betas=betas, eps=eps)
