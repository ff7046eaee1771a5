"""Did the actor act with its own network? The recorded behaviour parameters against that network on the stored
observations.

inv_acted_with_its_network (actor). After the first FIRST rollouts of a runner and every EVERY-th one after,
the runner runs its policy network again (no draw, no grad, the weights it acted with: none change during a
rollout) on POSITIONS stored observations drawn from a generator of its own, and compares the parameters with
the behaviour parameters it recorded there. Statistic: the largest |recomputed - recorded| / max(1, |recorded|)
over the compared rows. Rows the runner acted on with its fallback policy (an observation beyond its safe limit,
or a continuous policy whose output was non-finite) are left out, as are recurrent policies (the stored state is
the learner's to replay) and policies without a network (the probe agents): NaN.

Derivation: the same weights on the same observation give the same parameters; a batch of another size rounds
float32 sums in another order, about 1e-7 relative (limit 1e-4). A fault shows wherever the actor acts with
something other than its network on the observation it stores: another function or a fallback everywhere, an
observation changed for acting only, the previous step's observation. The learner's log-probabilities at the
same observations (learner_sees_actor_data) then disagree too; this check, upstream, names the actor.
"""

from __future__ import annotations

import math

import numpy as np
import torch

FIRST, EVERY = 16, 16
"""Checked rollouts: each of a runner's first FIRST, then every EVERY-th."""
POSITIONS = 32
"""Stored (step, env) positions compared per checked rollout."""


def policy_network(policy):
    """The callable giving the policy network's distribution parameters for a batch of observations, or None."""
    params = getattr(policy, "policy_params", None)
    if params is not None:
        return params
    if hasattr(policy, "net") and hasattr(policy, "forward"):   # a network acting from another device
        return policy.forward
    return None


class ActingCheck:
    """The statistic of one runner's checked rollouts."""

    def __init__(self, seed: int, safe_limit: float):
        """`safe_limit`: the runner's; an observation beyond it (or non-finite) was acted on with its fallback."""
        self.safe_limit = safe_limit
        self.collects = 0
        self.generator = np.random.default_rng(seed)   # its own: the run's generators are not drawn from

    def measure(self, policy, obs: np.ndarray, params: np.ndarray | None, recurrent: bool) -> float:
        """`obs` [T+1, N, ...] as stored, `params` [T, N, P] as recorded."""
        checked = self.collects < FIRST or self.collects % EVERY == 0
        self.collects += 1
        network = policy_network(policy)
        if not checked or recurrent or network is None or params is None or params.size == 0:
            return math.nan
        T, N = params.shape[:2]
        flat = self.generator.choice(T * N, size=min(POSITIONS, T * N), replace=False)
        t, n = np.divmod(flat, N)
        seen = obs[t, n]
        safe = (np.abs(seen) <= self.safe_limit).reshape(len(seen), -1).all(1)
        if not safe.any():
            return math.nan
        with torch.no_grad():
            again = network(torch.as_tensor(seen[safe])).float().numpy().astype(np.float64)
        recorded = params[t[safe], n[safe]].astype(np.float64)
        rows = np.isfinite(again).all(1)   # a non-finite output was replaced by the fallback's
        if not rows.any():
            return math.nan
        gap = np.abs(again[rows] - recorded[rows]) / np.maximum(1.0, np.abs(recorded[rows]))
        return float(gap.max())
