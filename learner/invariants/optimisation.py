"""Optimisation: every parameter with a gradient is in the optimizer and moves; the gradient stepped with is this
backward pass's alone, clipped as configured; no loss term starves the others under the shared clip.

optimizer_coverage (optimizer). Count of parameters that require a gradient
but are in no optimizer group (every update), plus, on sampled updates,
parameters that the reference Adam step of the first minibatch
(optimizer_step.py) moves beyond float32 rounding and that did not change at
all over the update: the later steps of the update would have to undo that
first step exactly. A parameter whose every step rounds away in float32 (a
converged run: gradients near 1e-9, steps far below a parameter's ulp) is not
judged, as not moving is then what a correct optimizer does. Exact: limit 0.
The "did not change" part is not judged while the learning rate is 0 (the
statistic is then the missing count when there is one, else NaN).

gradient_of_loss (optimizer). On each sampled update's first minibatch, the norm of
every parameter's .grad between zero_grad and the backward pass, against its
norm after it: ||grad before|| / ||grad after||. The gradient the optimizer
steps with must be this backward pass's alone, so a correct learner reads
exactly 0 in any precision; gradients of earlier steps left by a missing or
misplaced zero_grad (or a parameter whose .grad the optimizer does not zero)
read their size against this minibatch's gradient. With clipping that stale
part is about max_grad_norm against a gradient norm of 5 to 50: 1e-2 to 1e-1,
which the projection onto the value head's bias that `gradient_mismatch`
exports (limit 0.05, for bfloat16's sake) misses about half the time. Limit
1e-3 (exact: no false alarm).

gradient_clipped_as_configured (optimizer). On each sampled update's first minibatch,
the gradient after the clip, c, against the one before it, g: clipping by the
global norm must give exactly g * min(1, max_grad_norm / ||g||), so the
statistic ||c - g * min(1, max_grad_norm / ||g||)|| / ||g * min(...)|| is
float32 rounding (about 1e-7) in a correct learner. Clipping each parameter on
its own, by value, at another norm, or not at all moves it to a share of 1e-2
or more. Limit 1e-3 (exact: no false alarm).

policy_starved (preprocessing). On sampled updates, when the first minibatch's
gradient is clipped (||g|| > max_grad_norm): ||g|| / ||g_policy||, with g_policy
the gradient of the policy loss term alone (one extra autograd.grad); 0 when
the gradient is not clipped. Not measured when the policy term's gradient is
exactly 0 (every sample clipped, or a collapsed policy: no share to speak of)
or when loss_gradient_policy is broken on the update (the policy term is then
not the surrogate, and its size says nothing of the scale). The policy term's
gradient is of the order of the normalised advantages' spread times the
policy's sensitivity; the value term's grows with the targets' scale. Healthy
runs read, after update 10: CartPole up to 6e2 (median 1.5e2), Acrobot up to
3.7e2, Pendulum up to 1.2e3 at gamma 0.9 and about 3e3 at gamma 0.99 (raw
rewards of -16 a step). A ratio of 1e4 needs value errors about 1e4 times the
advantages' spread, and 20 sampled updates in a row.
"""

from __future__ import annotations

import torch

from .common import F64, LOSS_GRADIENT_TOLERANCE, NAN


def _gradient_of(loss: torch.Tensor, params: list[torch.Tensor], keep_graph: bool) -> list[torch.Tensor]:
    """d loss / d param for each parameter, in float64 (zeros where the loss does not reach it)."""
    grads = (torch.autograd.grad(loss, params, retain_graph=keep_graph, allow_unused=True) if loss.requires_grad
             else [None] * len(params))
    return [torch.zeros_like(p, dtype=F64) if g is None else g.to(F64) for p, g in zip(params, grads, strict=True)]


def _norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of each tensor, stacked (one fused kernel where torch has it)."""
    if hasattr(torch, "_foreach_norm"):
        return torch.stack(torch._foreach_norm([t.detach() for t in tensors]))
    return torch.stack([t.detach().norm() for t in tensors])


def _norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all the tensors together (a non-empty list)."""
    return _norms(tensors).to(F64).norm()


def policy_share(params: list[torch.Tensor], grad_norm: torch.Tensor, policy_loss: torch.Tensor,
                 max_grad_norm: float, loss_gradient_policy: torch.Tensor) -> torch.Tensor:
    """||g|| / ||g_policy|| when the gradient is clipped, else 0. Needs policy_loss's graph (frees it).

    Not measured (NaN) when the policy term's gradient is exactly 0 (every sample clipped: there is no share to
    speak of) or is not the surrogate's (the loss invariant names that fault; its size says nothing of scale).
    """
    own = _norm(_gradient_of(policy_loss, [p for p in params if p.requires_grad], keep_graph=False))
    share = torch.where(grad_norm > max_grad_norm, grad_norm / own.clamp_min(1e-30), 0.0)
    return torch.where((own == 0) | (loss_gradient_policy > LOSS_GRADIENT_TOLERANCE), NAN, share)


def optimizer_coverage(params: list[torch.Tensor], optimizer, moves: torch.Tensor | None,
                       before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Parameters needing a gradient outside every optimizer group, plus those the reference step had to move
    beyond float32 rounding (`moves`, per parameter, from optimizer_step.AdamReference) that never moved."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = sum(1 for p in params if p.requires_grad and id(p) not in stepped)
    lr_zero = any(group.get("lr", 0.0) == 0 for group in optimizer.param_groups)
    if lr_zero or moves is None:
        return torch.full((), float(missing) if missing else NAN, device=before.device)
    moved = _norms(list(torch.split(after - before, [p.numel() for p in params]))) > 0
    frozen = (moves & ~moved).sum()
    return (frozen + missing).float()


def scheduled_learning_rate(learning_rate: float, anneal: bool, env_steps: float, total_env_steps: float) -> float:
    """The learning rate the config asks for after `env_steps` (the reference of learning_rate_as_configured):
    constant, or decayed linearly to 0 at `total_env_steps`."""
    if not anneal:
        return float(learning_rate)
    return float(learning_rate) * max(0.0, 1.0 - float(env_steps) / float(total_env_steps))


def learning_rate_gap(rates: list[float], expected: float) -> float:
    """inv_learning_rate_as_configured: the largest |lr - expected| / expected over the optimizer's groups (1 for
    any non-zero rate where 0 is expected); NaN without groups."""
    if not rates:
        return float("nan")
    if expected <= 0:
        return 1.0 if any(r != 0 for r in rates) else 0.0
    return max(abs(r - expected) / expected for r in rates)


def clip_error(before: torch.Tensor, after: torch.Tensor, max_norm: float) -> torch.Tensor:
    """inv_gradient_clipped_as_configured: how far the clipped flat gradient `after` is from `before` clipped by
    its global norm to `max_norm` (as torch's clip_grad_norm_ does, eps 1e-6), relative; 0-d, on the device."""
    g, c = before.to(F64), after.to(F64)
    expected = g * (max_norm / (g.norm() + 1e-6)).clamp(max=1.0)
    return (c - expected).norm() / expected.norm().clamp_min(torch.finfo(F64).tiny)


def optimizer_steps(optimizer) -> dict[int, float]:
    """Each parameter's step count in the optimizer's state (Adam's `step`; 0 where it has none yet), by id."""
    out = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step", 0.0)
            out[id(p)] = float(step)      # a CPU scalar for Adam unless capturable or fused: no device sync
    return out


def age_rise_gap(optimizer, before: dict[int, float] | None, after: dict[int, float], age_rise: int) -> float:
    """|age_rise - the rise of the optimizer's step counters| over an update (`before`, `after`: optimizer_steps),
    from the stepped parameters' counters; NaN when the optimizer keeps none, when nothing was stepped, or when a
    counter fell (the state restarted)."""
    if before is None:
        return float("nan")
    rises = {after[key] - before.get(key, 0.0) for group in optimizer.param_groups for p in group["params"]
             if p.grad is not None and (key := id(p)) in after and "step" in optimizer.state.get(p, {})}
    if not rises or min(rises) < 0:
        return float("nan")
    return float(max(abs(age_rise - rise) for rise in rises))


def optimizer_state_gap(optimizer, before: dict[int, float] | None, after: dict[int, float], steps: int) -> float:
    """inv_optimizer_state_kept: the share of parameters with a gradient whose optimizer step count did not
    advance by exactly the update's `steps` (`before`, `after`: optimizer_steps); NaN when the optimizer keeps no
    step count (plain SGD) or nothing was stepped."""
    if before is None or steps <= 0:
        return float("nan")
    keeps_steps = isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) or any(
        "step" in state for state in optimizer.state.values())
    if not keeps_steps:
        return float("nan")
    stepped = [id(p) for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not stepped:
        return float("nan")
    off = sum(1 for key in stepped if after.get(key, 0.0) != before.get(key, 0.0) + steps)
    return off / len(stepped)
