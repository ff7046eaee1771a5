"""Planted faults in the telemetry: in the exporter (the metrics a scrape reads differ from the values the run
computed, while the run's rows, verdicts and learning stay right: telemetry/exported.py's invariant), and in the
batch's statistics themselves (a distribution's extremes, a correlation, a scale or the entropy's change computed
wrong from right tensors: telemetry_recomputed's float64 recomputation)."""

from __future__ import annotations

import math

import pytest
import torch
from planted_bug import PlantedBug

STANDARD = {"verbosity": "standard"}
"""A user's default verbosity: the metrics are exported (the planted runs' default is off)."""
RAY = {"mode": "ray", "num_actors": 2, "torch_threads": 1, **STANDARD}


def kl_exported_in_bits(mp: pytest.MonkeyPatch) -> None:
    """The KL gauge is converted to bits on its way out, under a name that says nats."""
    from rlvitals.telemetry.recorder import Recorder

    original = Recorder._set

    def _set(self, name, value, labels=()):
        if name == "rlvitals_learner_kl_divergence_nats":
            value = value / math.log(2)
        return original(self, name, value, labels)

    mp.setattr(Recorder, "_set", _set)


def clip_fraction_exported_one_update_late(mp: pytest.MonkeyPatch) -> None:
    """The recorder keeps the previous update's clip fraction for its gauge (a cached copy refreshed late)."""
    from rlvitals.telemetry.recorder import Recorder

    original = Recorder.record_learn
    previous: dict = {}

    def record_learn(self, stats):
        current = stats.get("clip_fraction")
        if "clip_fraction" in previous:
            stats = {**stats, "clip_fraction": previous["clip_fraction"]}
        if current is not None:
            previous["clip_fraction"] = current
        return original(self, stats)

    mp.setattr(Recorder, "record_learn", record_learn)


def network_age_gauge_one_rollout_behind(mp: pytest.MonkeyPatch) -> None:
    """The actor's network-age gauge shows the age of the rollout before (a value cached and refreshed late)."""
    from rlvitals.telemetry.recorder import Recorder

    original = Recorder._set
    previous: dict = {}

    def _set(self, name, value, labels=()):
        if name == "rlvitals_actor_network_age":
            value, previous["age"] = previous.get("age", value), value
        return original(self, name, value, labels)

    mp.setattr(Recorder, "_set", _set)


def episode_gauges_over_every_episode(mp: pytest.MonkeyPatch) -> None:
    """The recorder's episode window is unbounded: the episode gauges summarise every episode of the run, not the
    last 100 the catalogue promises."""
    from rlvitals.telemetry.recorder import Recorder

    original = Recorder.__init__

    def __init__(self, level, component="local", window=100, strict=None):
        original(self, level, component, window=None, strict=strict)

    mp.setattr(Recorder, "__init__", __init__)


def consumed_counter_counts_every_epoch(mp: pytest.MonkeyPatch) -> None:
    """The samples-consumed counter is given the sample-gradient passes (samples x epochs), not the samples."""
    from rlvitals.telemetry.recorder import Recorder

    original = Recorder.record_learn

    def record_learn(self, stats):
        if "samples" in stats and "samples_learned" in stats:
            stats = {**stats, "samples": stats["samples_learned"]}
        return original(self, stats)

    mp.setattr(Recorder, "record_learn", record_learn)


def env_steps_counter_counts_reset_transitions(mp: pytest.MonkeyPatch) -> None:
    """The actor's env-step counter also counts the NEXT_STEP reset transitions, which are no env steps."""
    from rlvitals.telemetry.recorder import Recorder

    original = Recorder.record_rollout

    def record_rollout(self, rollout):
        original(self, rollout)
        with self.lock:
            self._inc("rlvitals_actor_env_steps_total", rollout.num_steps * rollout.num_envs - rollout.env_steps)

    mp.setattr(Recorder, "record_rollout", record_rollout)


TELEMETRY_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("kl_exported_in_bits", "telemetry", "run", kl_exported_in_bits, overrides=STANDARD,
               invariant="exported_as_computed",
               what="the KL gauge divided by ln 2 on its way to the scrape (bits under a name in nats)"),
    PlantedBug("clip_fraction_exported_one_update_late", "telemetry", "run", clip_fraction_exported_one_update_late,
               overrides=STANDARD, env="Pendulum-v1", invariant="exported_as_computed",
               what="the clip fraction's gauge holds the previous update's value"),
    PlantedBug("network_age_gauge_one_rollout_behind", "telemetry", "run", network_age_gauge_one_rollout_behind,
               overrides=STANDARD, invariant="exported_as_computed",
               what="the actor's network-age gauge holds the previous rollout's age"),
    PlantedBug("episode_gauges_over_every_episode", "telemetry", "run", episode_gauges_over_every_episode,
               overrides=STANDARD, invariant="exported_as_computed",
               what="the episode return and length gauges summarise every episode of the run, not the last 100"),
    PlantedBug("ray_network_age_gauge_one_rollout_behind", "telemetry", "run", network_age_gauge_one_rollout_behind,
               overrides=RAY, mode="ray", in_actors=True, invariant="exported_as_computed",
               what="as network_age_gauge_one_rollout_behind, in the Ray actors' own exporters"),
    PlantedBug("consumed_counter_counts_every_epoch", "telemetry", "run", consumed_counter_counts_every_epoch,
               overrides=STANDARD, env="Pendulum-v1", invariant="exported_as_computed",
               what="the samples-consumed counter given samples x epochs"),
    PlantedBug("ray_env_steps_counter_counts_reset_transitions", "telemetry", "run",
               env_steps_counter_counts_reset_transitions, overrides=RAY, mode="ray", in_actors=True,
               invariant="exported_as_computed",
               what="the Ray actors' env-step counters also count the reset transitions"),
    PlantedBug("ray_kl_exported_in_bits", "telemetry", "run", kl_exported_in_bits, overrides=RAY, mode="ray",
               invariant="exported_as_computed", what="as kl_exported_in_bits, with the learner of a Ray run"),
)


# ---------------------------------------------------------------- the batch's statistics, computed wrong


def terminal_correlation_of_the_next_values(mp: pytest.MonkeyPatch) -> None:
    """Each final reward is paired with the value of the step after it (the next episode's first state)."""
    from rlvitals.learner import diagnostics

    def terminal_correlations(values, rewards, terminated, valid, done):
        final = terminated & valid
        terminal = diagnostics.correlation(values[1:], rewards[:-1], final[:-1])
        penultimate_ok = final[1:] & valid[:-1] & ~done[:-1]
        return terminal, diagnostics.correlation(values[:-1], rewards[1:], penultimate_ok)

    mp.setattr(diagnostics, "terminal_correlations", terminal_correlations)


def extremes_over_reset_steps(mp: pytest.MonkeyPatch) -> None:
    """The distributions' min and max are taken over every stored step, the reset transitions' placeholders
    included (their means and stds stay right)."""
    from rlvitals.learner import diagnostics

    original = diagnostics.summaries

    def summaries(named, mask):
        out = original(named, mask)
        everything = original(named, torch.ones_like(mask))
        return {k: everything[k] if k.endswith(("_min", "_max")) else v for k, v in out.items()}

    mp.setattr(diagnostics, "summaries", summaries)


def value_target_scale_over_the_squared_horizon(mp: pytest.MonkeyPatch) -> None:
    """The target bound r_max / (1 - gamma) divided by (1 - gamma) once more: the ratio reads 1 / (1 - gamma)
    times too high."""
    from rlvitals.learner.ppo import PPOLearner

    original = PPOLearner._scale_stats

    def _scale_stats(self, rewards, targets, valid, done):
        out = original(self, rewards, targets, valid, done)
        if self.s.gamma < 1:
            out["value_target_scale"] = out["value_target_scale"] / (1 - self.s.gamma)
        return out

    mp.setattr(PPOLearner, "_scale_stats", _scale_stats)


def entropy_change_from_each_batch(mp: pytest.MonkeyPatch) -> None:
    """The initial entropy is taken again from every batch, so the change from the initial policy reads 0."""
    from rlvitals.learner.ppo import PPOLearner

    original = PPOLearner._batch_stats

    def _batch_stats(self, *args):
        self.initial_entropy = None
        return original(self, *args)

    mp.setattr(PPOLearner, "_batch_stats", _batch_stats)


def grad_norm_reported_after_the_clip(mp: pytest.MonkeyPatch) -> None:
    """Each step's gradient norm is summed as the clip left it (at most max_grad_norm), not as it was."""
    from rlvitals.learner.ppo import PPOLearner
    from rlvitals.learner.step_sums import StepSums

    original = StepSums.add
    limit: dict = {}
    original_init = PPOLearner.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        limit["max"] = self.s.max_grad_norm

    def add(self, loss, parts, grad_norm):
        return original(self, loss, parts, grad_norm.clamp(max=limit["max"]))

    mp.setattr(PPOLearner, "__init__", __init__)
    mp.setattr(StepSums, "add", add)


def value_loss_reported_without_the_half(mp: pytest.MonkeyPatch) -> None:
    """The value loss term is reported as the mean squared error, the loss itself keeping the 1/2."""
    from planted_bugs import _after_loss  # here: planted_bugs imports this module at its end

    _after_loss(mp, lambda loss, parts, s, args: (loss, {**parts, "value_loss": 2 * parts["value_loss"].detach()}))


def gradient_absmax_of_each_step_alone(mp: pytest.MonkeyPatch) -> None:
    """The gradient's abs-max restarts at every step, so the update reports its last first-epoch step's."""
    from rlvitals.learner.step_sums import StepSums

    original = StepSums.gradients

    def gradients(self, grads):
        self.grad_absmax = torch.zeros_like(self.grad_absmax)
        return original(self, grads)

    mp.setattr(StepSums, "gradients", gradients)


def head_norms_swapped(mp: pytest.MonkeyPatch) -> None:
    """The policy head's gradient norm is filed as the value head's, and the other way round."""
    from rlvitals.learner.step_sums import StepSums

    original = StepSums.result

    def result(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if "grad_norm_policy" in out and "grad_norm_value" in out:
            out["grad_norm_policy"], out["grad_norm_value"] = out["grad_norm_value"], out["grad_norm_policy"]
        return out

    mp.setattr(StepSums, "result", result)


STATISTICS_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("terminal_correlation_of_the_next_values", "telemetry", "run", terminal_correlation_of_the_next_values,
               env="FrozenLake-v1", invariant="telemetry_recomputed",
               what="the terminal correlation pairs each final reward with the next step's value (FrozenLake's "
                    "episodes end at a hole, 0, or the goal, 1)"),
    PlantedBug("extremes_over_reset_steps", "telemetry", "run", extremes_over_reset_steps,
               invariant="telemetry_recomputed",
               what="the batch's min and max taken over the reset transitions' placeholders too"),
    PlantedBug("value_target_scale_over_the_squared_horizon", "telemetry", "run",
               value_target_scale_over_the_squared_horizon, env="Pendulum-v1", invariant="telemetry_recomputed",
               what="the value-target scale's bound divided by (1 - gamma) twice"),
    PlantedBug("entropy_change_from_each_batch", "telemetry", "run", entropy_change_from_each_batch,
               env="Pendulum-v1", invariant="telemetry_recomputed",
               what="the entropy change measured from each batch's own entropy (always 0)"),
    PlantedBug("grad_norm_reported_after_the_clip", "telemetry", "run", grad_norm_reported_after_the_clip,
               invariant="telemetry_recomputed", what="the exported gradient norm is each step's after the clip"),
    PlantedBug("value_loss_reported_without_the_half", "telemetry", "run", value_loss_reported_without_the_half,
               env="Pendulum-v1", invariant="telemetry_recomputed",
               what="the value loss reported as twice what the loss holds (the mean squared error, no 1/2)"),
    PlantedBug("gradient_absmax_of_each_step_alone", "telemetry", "run", gradient_absmax_of_each_step_alone,
               env="Acrobot-v1", invariant="telemetry_recomputed",
               what="the gradient's abs-max restarted at every step (the last first-epoch step's is reported)"),
    PlantedBug("ray_head_norms_swapped", "telemetry", "run", head_norms_swapped, mode="ray",
               overrides={"mode": "ray", "num_actors": 2, "torch_threads": 1}, invariant="telemetry_recomputed",
               what="the policy and value heads' gradient norms exported under each other's names (Ray)"),
    PlantedBug("ray_extremes_over_reset_steps", "telemetry", "run", extremes_over_reset_steps, mode="ray",
               overrides={"mode": "ray", "num_actors": 2, "torch_threads": 1}, invariant="telemetry_recomputed",
               what="as extremes_over_reset_steps, with the learner of a Ray run"),
)
