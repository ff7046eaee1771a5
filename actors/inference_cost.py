"""The reference cost of an actor's inference phase: the policy network's forward pass alone, timed in the
actor's own process on the actor's own batch.

The inference phase of a rollout (`timings["inference_cpu"]`, its CPU seconds) is everything the actor
does per step besides the env's step: the forward pass, drawing the actions, the safety checks, the
copies. Its healthy share over the bare forward pass is a small factor (Python overhead on a tiny network,
about 1 on a large one); work hidden in the phase that the network does not need shows as a large factor.
Both sides are timed in the same process within a few rollouts of each other, and both in CPU seconds of
the process (`time.process_time`), so a slower machine moves them together and time the process spends
descheduled (eight Ray actors on two cores) counts in neither.

A policy offers the reference by having `forward(obs)`: the network's forward pass, nothing else (an
`ActorCritic`, or `parts.DevicePolicy` for a network on another device). Probe agents have none: no reference.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch

EVERY = 8
"""Time one forward pass every this many rollouts (and on the first): under 1% of the inference phase."""
REPEATS = 3
"""Forward passes per measurement: the first of a run is a cold one (lazy initialisation, caches)."""
KEPT = 2 * REPEATS
"""The reference is the fastest of this many latest timings: robust to a pause, quick to follow a slower
machine."""


def bare_forward(policy, obs: np.ndarray):
    """A call running the policy network's forward pass on `obs`, nothing else (no draw, no grad); None for a
    policy with no `forward` (the probe agents)."""
    forward = getattr(policy, "forward", None)
    if forward is None:
        return None
    batch = torch.as_tensor(obs)

    def run():
        with torch.no_grad():
            forward(batch)
    return run


class ForwardCost:
    def __init__(self):
        self.collects = 0
        self.timings: deque[float] = deque(maxlen=KEPT)

    def measure(self, policy, obs: np.ndarray) -> None:
        """Before a rollout: every EVERY-th time, one timed forward pass of the policy's network on `obs`."""
        self.collects += 1
        run = None if (self.collects - 1) % EVERY else bare_forward(policy, obs)
        if run is None:
            return
        for _ in range(REPEATS):
            start = time.process_time()
            run()
            self.timings.append(time.process_time() - start)

    def reference(self) -> dict[str, float]:
        """`{"forward_reference": seconds}` for the rollout's timings, once one forward pass was timed."""
        return {"forward_reference": min(self.timings)} if self.timings else {}
