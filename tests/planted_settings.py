"""Planted faults between the config and the learner: a setting handed to the learner wrong (the wiring that
builds the learner's settings from the run's config). Every part then agrees with the copy it was handed, so
only references that read the config's own values see it, at the stage that uses the setting: the returns for
the discount, the loss for its clip range and weights, the clip and the optimizer for theirs."""

from __future__ import annotations

import dataclasses

from planted_bug import PlantedBug

PENDULUM = "Pendulum-v1"
RAY = {"mode": "ray", "num_actors": 2, "torch_threads": 1}


def _handed(mp, change) -> None:
    """The learner is built with `change(settings)` instead of the settings the config says."""
    from rlvitals import parts

    original = parts.ppo_settings
    mp.setattr(parts, "ppo_settings", lambda cfg: change(original(cfg)))


def discount_and_lambda_swapped(mp):
    _handed(mp, lambda s: dataclasses.replace(s, gamma=s.gae_lambda, gae_lambda=s.gamma))


def clip_range_doubled(mp):
    _handed(mp, lambda s: dataclasses.replace(s, clip_coef=2 * s.clip_coef))


def value_weight_halved(mp):
    _handed(mp, lambda s: dataclasses.replace(s, value_coef=s.value_coef / 2))


def gradient_clip_ten_times_looser(mp):
    _handed(mp, lambda s: dataclasses.replace(s, max_grad_norm=10 * s.max_grad_norm))


def adam_epsilon_of_torch(mp):
    _handed(mp, lambda s: dataclasses.replace(s, adam_eps=1e-8))   # torch's default, not the documented 1e-5


SETTINGS_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("discount_and_lambda_swapped", "returns", "run", discount_and_lambda_swapped,
               invariant="returns_recomputed", what="the learner is handed gamma as lambda and lambda as gamma"),
    PlantedBug("clip_range_doubled", "policy", "run", clip_range_doubled, invariant="policy_loss_as_configured",
               what="the learner is handed twice the configured clip range"),
    PlantedBug("ray_clip_range_doubled", "policy", "run", clip_range_doubled, overrides=RAY, mode="ray",
               invariant="policy_loss_as_configured", what="as clip_range_doubled, with the learner of a Ray run"),
    PlantedBug("pendulum_value_weight_halved", "value", "run", value_weight_halved, env=PENDULUM,
               invariant="loss_gradient_value", what="the learner is handed half the configured value-loss weight"),
    PlantedBug("pendulum_gradient_clip_ten_times_looser", "optimizer", "run", gradient_clip_ten_times_looser,
               env=PENDULUM, invariant="gradient_clipped_as_configured",
               what="the learner is handed ten times the configured max_grad_norm"),
    PlantedBug("adam_epsilon_of_torch", "optimizer", "run", adam_epsilon_of_torch,
               invariant="optimizer_step_as_configured",
               what="the learner's Adam gets epsilon 1e-8 instead of the documented 1e-5"),
)
