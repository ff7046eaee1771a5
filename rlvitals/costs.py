"""Each phase's cost per unit against a reference measured in the same process, in CPU seconds:

- `actor_inference_cost_ratio`: the actor's inference phase per env step over its policy network's bare forward
  pass on the actor's batch (actors/inference_cost.py). Healthy readings are a small factor: the phase also draws
  the actions and checks them.
- `actor_env_step_cost_ratio`: the actor's env-step phase per env step over one step of a separate copy of the env
  as gymnasium builds it (actors/env_step_cost.py). Healthy readings are near 1: the phase adds the project's
  wrappers (witness, probes) and the reward check, a few per cent of a step.
- `learner_minibatch_cost_ratio`: the learner's minibatch phase per optimizer step over a forward, backward and
  optimizer step of a copy of its network on a minibatch of the configured size (learner/minibatch_cost.py;
  the learner reports it in its stats).

The actor's ratios are taken for each arriving rollout whose actor timed its references (a Ray sync batch joins
several actors' rollouts and drops their timings: not measured there).
"""

from __future__ import annotations

import math

from rlvitals.learner.minibatch_cost import KEY as MINIBATCH_KEY  # noqa: F401  (the learner's ratio, by name)

KEY = "actor_inference_cost_ratio"
ENV_STEP_KEY = "actor_env_step_cost_ratio"

ACTOR_PHASES = ((KEY, "inference_cpu", "forward_reference"), (ENV_STEP_KEY, "env_step_cpu", "env_step_reference"))
"""(row key, the phase's CPU seconds in a rollout's timings, its reference's seconds per step there)."""


def actor_cost_ratios(rollout) -> dict[str, float]:
    """{key: ratio} for each actor phase whose CPU seconds and reference the rollout carries."""
    timings = getattr(rollout, "timings", None) or {}
    steps = rollout.rewards.shape[0] if rollout.rewards is not None and rollout.rewards.dim() else 0
    out = {}
    for key, phase, reference in ACTOR_PHASES:
        per_step, seconds = timings.get(reference), timings.get(phase)
        if per_step and seconds is not None and steps and math.isfinite(per_step) and per_step > 0:
            out[key] = seconds / steps / per_step
    return out


def inference_cost_ratio(rollout) -> dict[str, float]:
    """{KEY: ratio} when the rollout carries both its inference time and its reference; {} otherwise."""
    return {k: v for k, v in actor_cost_ratios(rollout).items() if k == KEY}
