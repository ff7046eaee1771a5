"""Each phase's cost against a reference measured in the same process: the actor's inference phase per step
against its policy network's bare forward pass (actors/inference_cost.py).

`actor_inference_cost_ratio` = (inference CPU seconds / steps) / (forward-pass CPU seconds), for each arriving rollout
whose actor timed a reference (a Ray sync batch joins several actors' rollouts and drops their timings: not
measured there). Healthy readings are a small factor: the phase also draws the actions and checks them.
"""

from __future__ import annotations

import math

KEY = "actor_inference_cost_ratio"


def inference_cost_ratio(rollout) -> dict[str, float]:
    """{KEY: ratio} when the rollout carries both its inference time and its reference; {} otherwise."""
    timings = getattr(rollout, "timings", None) or {}
    reference, inference = timings.get("forward_reference"), timings.get("inference_cpu")
    steps = rollout.rewards.shape[0] if rollout.rewards is not None and rollout.rewards.dim() else 0
    if not reference or inference is None or steps == 0 or not math.isfinite(reference) or reference <= 0:
        return {}
    return {KEY: inference / steps / reference}
