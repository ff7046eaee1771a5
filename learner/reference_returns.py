"""A slow float64 V-trace in the paper's notation: the reference the learner's targets are checked against.

Written apart from `returns.vtrace` on purpose (no shared helper, no import of
it): the `returns_recomputed` invariant compares the two on the learner's own
data, so a fault in the returns code, or in what the learner feeds it, cannot
be copied into the reference. Notation of Espeholt et al. (2018), eq. 1 and
section 4.2, with lambda as in docs/vtrace.md:

    delta_s = r_s + gamma (1 - term_s) V(x_{s+1}) - V(x_s)
    rho_s   = min(rho_bar, pi/mu(a_s|x_s)),   c_s = lambda min(c_bar, pi/mu(a_s|x_s))
    v_s - V(x_s) = rho_s delta_s + gamma c_s (v_{s+1} - V(x_{s+1}))     if s+1 continues s's episode
    A_s          = delta_s + gamma lambda (v_{s+1} - V(x_{s+1}))         if s+1 continues s's episode
    v_s - V(x_s) = rho_s delta_s,   A_s = delta_s                       otherwise

Step s+1 continues step s's episode when s is not the rollout's last step, the
episode did not end at s (terminated or truncated) and s+1 is a valid step
(not the reset transition of NEXT_STEP autoreset). Outputs at invalid steps are
not defined (they are never learned from).
"""

from __future__ import annotations

import torch

F64 = torch.float64


def continues(terminated: torch.Tensor, truncated: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[T, N] bool: step s+1 of the same env belongs to step s's episode."""
    follows = torch.zeros_like(valid)
    follows[:-1] = ~(terminated[:-1] | truncated[:-1]) & valid[1:]
    return follows


def vtrace_reference(values, next_values, rewards, terminated, truncated, valid, log_rhos, gamma: float,
                     lam: float, rho_clip: float, c_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(v_s, A_s) for every step of a [T, N] rollout, in float64, one time step at a time."""
    V, V_next, r = values.to(F64), next_values.to(F64), rewards.to(F64)
    pi_over_mu = log_rhos.to(F64).exp()
    rho = pi_over_mu.clamp(max=rho_clip)
    c = lam * pi_over_mu.clamp(max=c_clip)
    bootstrap = (~terminated).to(F64)
    delta = r + gamma * bootstrap * V_next - V
    # What step s takes from v_{s+1} - V(x_{s+1}): gamma c_s for its target, gamma lambda for its advantage,
    # 0 where s+1 is not in s's episode. Invalid steps start nothing (their delta is not a transition).
    follows = continues(terminated, truncated, valid).to(F64)
    to_target, to_advantage = gamma * c * follows, gamma * lam * follows
    own = torch.where(valid, rho * delta, 0.0)          # rho_s delta_s
    correction = torch.empty_like(V)                    # v_s - V(x_s)
    advantage = torch.empty_like(V)
    later = torch.zeros_like(V[0])                      # v_{s+1} - V(x_{s+1})
    for s in range(r.shape[0] - 1, -1, -1):
        torch.addcmul(delta[s], to_advantage[s], later, out=advantage[s])
        torch.addcmul(own[s], to_target[s], later, out=correction[s])
        later = correction[s]
    return V + correction, advantage
