"""Discounting, GAE and V-trace over time-major [T, N] batches.

Conventions shared by all three:
- `next_values[t]` is V(obs[t+1]); for a truncated step obs[t+1] is the true
  final observation, so truncation bootstraps and termination does not.
- `terminated[t]` zeroes the bootstrap; `done[t]` (terminated or truncated)
  stops credit from flowing back across the episode boundary.
- `valid[t] = False` marks NEXT_STEP reset transitions: they contribute nothing
  and nothing flows through them.
"""

from __future__ import annotations

import torch


def _masks(terminated, done, valid, dtype):
    # Masks take the data's dtype: float32 masks would round gamma to float32
    # (`gamma * mask`) and silently cost float64 inputs their precision.
    not_terminal = (~terminated).to(dtype)
    carry = (~(done | ~valid)).to(dtype) if valid is not None else (~done).to(dtype)
    live = valid.to(dtype) if valid is not None else torch.ones_like(not_terminal)
    return not_terminal, carry, live


def discounted_returns(rewards, next_values, terminated, done, gamma: float, valid=None):
    """Reward-to-go: G_t = r_t + gamma * G_{t+1} within an episode, bootstrapped at cuts."""
    not_terminal, carry, live = _masks(terminated, done, valid, rewards.dtype)
    returns = torch.zeros_like(rewards)
    following = next_values[-1] * not_terminal[-1]
    for t in reversed(range(rewards.shape[0])):
        # At an episode cut (or the rollout's end) continue from the bootstrap value.
        tail = torch.where(carry[t] > 0, following, next_values[t] * not_terminal[t])
        returns[t] = (rewards[t] + gamma * tail) * live[t]
        following = returns[t]
    return returns


def gae(values, next_values, rewards, terminated, done, gamma: float, lam: float, valid=None):
    """Generalised advantage estimation (Schulman et al., 2016)."""
    not_terminal, carry, live = _masks(terminated, done, valid, rewards.dtype)
    deltas = (rewards + gamma * not_terminal * next_values - values) * live
    advantages = torch.zeros_like(rewards)
    acc = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        acc = deltas[t] + gamma * lam * carry[t] * acc
        advantages[t] = acc
    return advantages


def vtrace(values, next_values, rewards, terminated, done, log_rhos, gamma: float, lam: float,
           rho_clip: float = 1.0, c_clip: float = 1.0, valid=None):
    """V-trace targets (Espeholt et al., 2018, eq. 1, with lambda) and the PPO advantage.

    Targets:  v_s - V(x_s) = rho_s delta_s + gamma c_s (v_{s+1} - V(x_{s+1})),
              rho = min(rho_clip, pi/mu),  c = lam * min(c_clip, pi/mu).
    Advantage: A_s = delta_s + gamma lam (v_{s+1} - V(x_{s+1}))
                   = r_s + gamma [(1 - lam) V(x_{s+1}) + lam v_{s+1}] - V(x_s).

    The advantage estimates Q(x_s, a_s) - V(x_s) for the action actually taken, so
    that action's own ratio cuts nothing: with lam = 1 it is the paper's
    r_s + gamma v_{s+1} - V(x_s) (section 4.2), and lam mixes the bootstrap in as the
    lambda-return does. It leaves out the paper's leading rho_s because PPO's
    surrogate multiplies by pi/mu itself. At an episode cut or the rollout's end
    v_{s+1} - V(x_{s+1}) is 0, so A_s = delta_s. On-policy (log_rhos = 0, clips >= 1)
    v_{s+1} - V(x_{s+1}) is GAE_{s+1}, so both reduce exactly to GAE(lambda).
    Derivation: docs/vtrace.md.
    """
    not_terminal, carry, live = _masks(terminated, done, valid, rewards.dtype)
    rhos = log_rhos.exp()
    clipped_rho = rhos.clamp(max=rho_clip)
    cs = lam * rhos.clamp(max=c_clip)
    deltas = (rewards + gamma * not_terminal * next_values - values) * live
    corrections = torch.zeros_like(rewards)   # v_s - V(x_s)
    advantages = torch.zeros_like(rewards)
    acc = torch.zeros_like(rewards[0])        # v_{s+1} - V(x_{s+1})
    for t in reversed(range(rewards.shape[0])):
        # carry[t] = 0 across a cut: nothing after it belongs to this episode.
        advantages[t] = deltas[t] + gamma * lam * carry[t] * acc
        acc = clipped_rho[t] * deltas[t] + gamma * cs[t] * carry[t] * acc
        corrections[t] = acc
    return values + corrections, advantages
