"""Running sums over one batch's optimizer steps, kept on the device."""

from __future__ import annotations

import torch


class StepSums:
    """Running sums over one batch's optimizer steps, kept on the device (no sync in the loop)."""

    def __init__(self, dev: torch.device):
        self.sums: dict[str, torch.Tensor] = {}
        self.loss_ok = torch.ones((), dtype=torch.bool, device=dev)
        self.grads_ok = torch.ones((), dtype=torch.bool, device=dev)
        self.grad_absmax = torch.zeros((), device=dev)
        self.kl = torch.zeros((), device=dev)
        self.small_sq = torch.zeros((), device=dev)   # sum of |g_minibatch|^2 over the first epoch
        self.big_grad = None                          # sum of the first epoch's minibatch gradients

    def add(self, loss, parts: dict, grad_norm, grads, first_epoch: bool) -> None:
        self.loss_ok &= torch.isfinite(loss.detach())
        self.grads_ok &= torch.isfinite(grad_norm)
        for k, v in parts.items():
            self.sums[k] = self.sums.get(k, 0.0) + v.detach()
        self.sums["grad_norm"] = self.sums.get("grad_norm", 0.0) + grad_norm.detach()
        self.sums["grad_meansq"] = self.sums.get("grad_meansq", 0.0) + grads.pow(2).mean()
        self.grad_absmax = torch.maximum(self.grad_absmax, grads.abs().max())
        if first_epoch:
            self.small_sq = self.small_sq + grads.pow(2).sum()
            self.big_grad = grads.clone() if self.big_grad is None else self.big_grad + grads

    def result(self, steps: int, count: int, num_minibatches: int, noise_scale) -> dict:
        """Means per step, the KL per sample and the gradient noise scale from the first epoch's two batch sizes."""
        n_first = max(1, min(num_minibatches, count))
        noise = noise_scale.update(self.small_sq / n_first, (self.big_grad / n_first).pow(2).sum(),
                                   count / n_first, float(count))
        return {**{k: v / steps for k, v in self.sums.items()}, "grad_absmax": self.grad_absmax,
                "kl": self.kl / max(count, 1), "grad_noise_scale": noise,
                "loss_finite": self.loss_ok.float(), "grads_finite": self.grads_ok.float()}
