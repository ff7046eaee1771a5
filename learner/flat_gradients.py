"""The network's gradients kept as views of one flat buffer, so the flat gradient costs no copy."""

from __future__ import annotations

import torch
from torch import nn

from . import diagnostics as diag


class FlatGradients:
    """Every parameter's `.grad` is a view into one buffer laid out in `parameters()` order (as
    diag.flat_grads lays it out): backward accumulates into the views in place, zero_grad(set_to_none=False)
    and the clip work on them in place, so the buffer is the flat gradient. Something that replaces a `.grad`
    (zero_grad(set_to_none=True), an assignment) is noticed on the next read and the views are rebuilt around
    the gradient as it then is. Parameters of mixed dtypes or devices cannot share a buffer: they are
    concatenated on each read instead."""

    def __init__(self, net: nn.Module):
        self.net = net
        self.params = list(net.parameters())
        kinds = {(p.dtype, p.device) for p in self.params}
        self.buffer = None
        if len(kinds) == 1:
            dtype, device = kinds.pop()
            self.buffer = torch.zeros(sum(p.numel() for p in self.params), dtype=dtype, device=device)
            self._attach()

    def _attach(self) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.params:
                view = self.buffer[offset: offset + p.numel()].view_as(p)
                view.copy_(p.grad) if p.grad is not None else view.zero_()
                p.grad = view
                offset += p.numel()
        self.addresses = [p.grad.data_ptr() for p in self.params]

    def flat(self) -> torch.Tensor:
        """The flat gradient, live: the next backward, clip or zero_grad changes it (clone to keep it)."""
        if self.buffer is None:
            return diag.flat_grads(self.net)
        if any(p.grad is None or p.grad.data_ptr() != a for p, a in zip(self.params, self.addresses, strict=True)):
            self._attach()
        return self.buffer
