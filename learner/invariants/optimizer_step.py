"""The optimizer's step against a reference Adam applied to a copy of the state it stepped from.

optimizer_step_as_configured (optimizer). On each sampled update's first
minibatch, between the clip and the step, the parameters p, their (clipped)
gradients g, Adam's moments m, v and step counts t, and each group's learning
rate are copied. After the step the reference, written here in float64 from
Kingma & Ba (2015) with the configured betas and epsilon (not the optimizer's
own), gives
    m' = b1 m + (1 - b1) g,   v' = b2 v + (1 - b2) g^2,
    p' = p - lr (m' / (1 - b1^(t+1))) / (sqrt(v' / (1 - b2^(t+1))) + eps),
and zero change for a parameter without a gradient; the moments the optimizer
keeps for the next step must be m' and v'. Per element the step
taken may differ from it by float32 rounding: 4 ulps of the parameter plus
1e-5 of the step's magnitude (m' computed from |m| and |g|, so a moment that
cancels to near 0 is not judged against its own rounding), and each kept
moment 1e-5 of its own scale; everywhere 4 x float32's smallest normal number
more (moments that decay under zero gradients turn subnormal, where float32
rounds to multiples of 1.4e-45). Statistic: the norm of what exceeds that (a
moment's excess weighted by its parameter's step), over the norm of the steps'
magnitudes; 0 in a correct
learner whatever the gradient's size (a step that rounds away in float32 is
within the allowance), so the limit is 1e-3 with no false alarm. Another
optimizer, other betas, epsilon or weight decay, a step scaled inside the
optimizer while the group's learning rate reads right, or moments not updated
break it; the learning rate and step counts have invariants of their own.

The same reference says which parameters the step had to move beyond float32
resolution: optimizer_coverage judges only those (a converged run whose steps
round away moves nothing, correctly).
"""

from __future__ import annotations

import torch

from .common import F64, NAN

FLOAT32_ULP = float(torch.finfo(torch.float32).eps)
FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)
"""The smallest normal float32: below it values are subnormal and lose relative precision (a moment decaying
towards 0 under zero gradients gets stuck at a few multiples of 1.4e-45), so differences under 4 of it are
rounding."""
STEP_ROUNDING = 1e-5
"""Relative float32 error allowed in a computed step (a few operations of about 6e-8 each)."""


class AdamReference:
    """Snapshot before one optimizer step (`before`), judgement after it (`after`)."""

    def __init__(self, betas: tuple[float, float], eps: float):
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)
        self.snapshot: dict | None = None

    def before(self, optimizer, params: list[torch.Tensor]) -> None:
        """Copy what the step starts from: parameters, gradients, moments, step counts and learning rates."""
        lr_of = {id(p): float(group["lr"]) for group in optimizer.param_groups for p in group["params"]}
        rows = []
        for index, p in enumerate(params):
            if id(p) not in lr_of:
                continue   # outside every group: optimizer_coverage counts it
            state = optimizer.state.get(p, {})
            def copy(name, state=state, p=p):
                return state[name].detach().to(F64).clone() if name in state else torch.zeros_like(p, dtype=F64)
            grad = p.grad.detach().to(F64).clone() if p.grad is not None else None
            rows.append((index, p, p.detach().to(F64).clone(), grad, copy("exp_avg"), copy("exp_avg_sq"),
                         float(state.get("step", 0.0)), lr_of[id(p)]))
        self.snapshot = {"rows": rows, "state": optimizer.state, "count": len(params),
                         "device": params[0].device if params else None}

    def after(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inv_optimizer_step_as_configured, for each parameter `before` was given whether the reference step
        moves it beyond float32 rounding), on the parameters' device: nothing here waits for it."""
        snapshot, self.snapshot = self.snapshot, None
        rows, optimizer_state = snapshot["rows"], snapshot["state"]
        b1, b2 = self.betas
        excess_sq, magnitude_sq = [], []
        moves = torch.zeros(snapshot["count"], dtype=torch.bool, device=snapshot["device"])
        for index, p, p0, g, m, v, t, lr in rows:
            p1 = p.detach().to(F64)
            if g is None:   # Adam leaves a parameter without a gradient alone
                expected, size = torch.zeros_like(p0), torch.zeros_like(p0)
            else:
                bc1, bc2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)
                m1, v1 = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
                denom = (v1 / bc2).sqrt() + self.eps
                expected = -lr * (m1 / bc1) / denom
                size = lr * (b1 * m.abs() + (1 - b1) * g.abs()) / bc1 / denom
            rounding = 4 * FLOAT32_ULP * torch.maximum(p0.abs(), p1.abs()) + 4 * FLOAT32_TINY
            excess = ((p1 - p0) - expected).abs() - rounding - STEP_ROUNDING * size
            excess_sq.append(excess.clamp_min(0).pow(2).sum())
            magnitude_sq.append(size.pow(2).sum())
            if g is not None:   # the moments the step leaves for the next one, each against its own scale
                state = optimizer_state.get(p, {})
                for name, reference, scale in (("exp_avg", m1, b1 * m.abs() + (1 - b1) * g.abs()),
                                               ("exp_avg_sq", v1, v1)):
                    kept = state[name].detach().to(F64) if name in state else torch.zeros_like(reference)
                    off = (kept - reference).abs() - STEP_ROUNDING * scale - 4 * FLOAT32_TINY
                    share = off.clamp_min(0).norm() / scale.norm().clamp_min(1e-300)
                    excess_sq.append((share * size.norm()).pow(2))
            moves[index] = (expected.abs() > 4 * FLOAT32_ULP * p0.abs() + STEP_ROUNDING * size).any()
        if not rows:
            return torch.full((), NAN, dtype=F64, device=moves.device), moves
        excess, magnitude = torch.stack(excess_sq).sum().sqrt(), torch.stack(magnitude_sq).sum().sqrt()
        statistic = torch.where(magnitude > 0, excess / magnitude.clamp_min(1e-300),
                                torch.where(excess > 0, 1.0, NAN))
        return statistic, moves
