"""Running sums over one batch's optimizer steps, kept on the device."""

from __future__ import annotations

import torch


def head_ranges(heads: dict[str, torch.Tensor]) -> dict[str, list[tuple[int, int]]]:
    """Each head's positions in the flat gradient (transfer.head_positions) as contiguous [start, end) runs: a
    head's parameters lie in one or two runs, so its squared norm is a slice sum or two, not a gather."""
    out = {}
    for head, at in heads.items():
        positions = sorted(at.tolist())
        runs: list[tuple[int, int]] = []
        for i in positions:
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
        out[head] = runs
    return out


class HeadRuns:
    """Where each output head's parameters lie in the flat gradient, as runs: worked out once per learner."""

    def __init__(self, heads: dict[str, torch.Tensor], dev: torch.device):
        """`heads`: each head's positions in the flat gradient (transfer.head_positions)."""
        runs = head_ranges(heads)
        self.names = list(runs)
        self.runs = [run for head_runs in runs.values() for run in head_runs]
        owners = [i for i, head_runs in enumerate(runs.values()) for _ in head_runs]
        # Mostly one run per head: the runs' sums are then the heads' sums, no scatter needed.
        self.run_head = None if owners == list(range(len(runs))) else torch.tensor(owners, device=dev)

    def squared_norms(self, sq: torch.Tensor) -> torch.Tensor:
        """Each head's sum of `sq` (the squared flat gradient), in `names` order."""
        sums = torch.stack([sq[a:b].sum() for a, b in self.runs]) if self.runs else sq.new_zeros(0)
        if self.run_head is None:
            return sums
        return sums.new_zeros(len(self.names)).index_add_(0, self.run_head, sums)


class StepSums:
    """Running sums over one batch's optimizer steps, kept on the device (no sync in the loop).

    Every step keeps its loss terms and its global gradient norm (the clip's) stacked into one row: one tensor
    operation whatever the number of terms, the rows summed once at the end. The gradient's distribution (abs-max,
    mean-square, each head's norm) and the noise scale are taken on the first epoch, where each sample is seen
    once under the policy that collected it; later epochs cost no pass over the gradient. Finiteness needs no
    op per step either: a sum is finite exactly when every term added to it was (NaN and inf propagate).
    """

    def __init__(self, dev: torch.device, heads: HeadRuns):
        self.heads = heads
        self.keys: list[str] | None = None
        self.rows: list[torch.Tensor] = []        # each step's scalars, in `keys` order
        self.first: torch.Tensor | None = None    # running sum over the first epoch: |g|^2, per-head norms, meansq
        self.first_steps = 0
        self.grad_absmax = torch.zeros((), device=dev)
        self.last_epoch: list[tuple[torch.Tensor, torch.Tensor]] = []   # (minibatch, policy parameters)
        self.big_grad = None                      # sum of the first epoch's minibatch gradients

    @torch.no_grad()
    def gradients(self, grads: torch.Tensor) -> None:
        """A first-epoch step's flat gradient before clipping (learner/flat_gradients.py): its statistics."""
        sq = grads * grads
        total = sq.sum().reshape(1)
        first = torch.cat([total, self.heads.squared_norms(sq).sqrt(), total / grads.numel()])
        self.first = first if self.first is None else self.first.add_(first)
        self.first_steps += 1
        self.grad_absmax = torch.maximum(self.grad_absmax, grads.abs().amax())
        self.big_grad = grads.clone() if self.big_grad is None else self.big_grad.add_(grads)

    @torch.no_grad()
    def add(self, loss: torch.Tensor, parts: dict, grad_norm: torch.Tensor) -> None:
        """Every step: its loss, its loss terms and its gradient norm before clipping (the clip's)."""
        if self.keys is None:
            self.keys = ["loss", *parts, "grad_norm"]
        self.rows.append(torch.stack([loss, *parts.values(), grad_norm]))   # one op; summed once, in result

    def kl_step(self, minibatch: torch.Tensor, params: torch.Tensor) -> None:
        """A last-epoch step: its samples' positions and the policy's parameters on them (detached); the KL
        from the behaviour policy is taken over all of them at once, in `result`."""
        self.last_epoch.append((minibatch, params.detach()))

    @torch.no_grad()
    def result(self, steps: int, count: int, noise_scale, dist, behaviour_params: torch.Tensor) -> dict:
        """Means per step, the first epoch's gradient statistics, the KL per sample of the last epoch (the
        batch's `behaviour_params` against the policy that learned each sample) and the gradient noise scale from
        the first epoch's two batch sizes (its minibatch and the whole batch)."""
        kl = torch.zeros((), device=self.grad_absmax.device)
        if self.last_epoch:
            learned = torch.cat([mb for mb, _ in self.last_epoch])
            kl = dist.kl(behaviour_params[learned], torch.cat([p for _, p in self.last_epoch]).float()).sum()
        n = max(1, self.first_steps)
        means = dict(zip(self.keys, (torch.stack(self.rows).float().sum(0) / steps).unbind(), strict=True))
        small_sq, *heads, meansq = (self.first / n).unbind()
        noise = noise_scale.update(small_sq, (self.big_grad / n).pow(2).sum(), count / n, float(count))
        loss = means.pop("loss")
        return {**means, **{f"grad_norm_{h}": x for h, x in zip(self.heads.names, heads, strict=True)},
                "grad_meansq": meansq, "grad_absmax": self.grad_absmax, "kl": kl / max(count, 1),
                "grad_noise_scale": noise, "loss_finite": torch.isfinite(loss).float(),
                "grads_finite": torch.isfinite(means["grad_norm"]).float()}
