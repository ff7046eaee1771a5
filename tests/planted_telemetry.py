"""Planted faults in the exporter: the metrics a scrape reads differ from the values the run computed, while the
run's rows, verdicts and learning stay right (telemetry/exported.py's invariant)."""

from __future__ import annotations

import math

import pytest
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


TELEMETRY_BUGS: tuple[PlantedBug, ...] = (
    PlantedBug("kl_exported_in_bits", "telemetry", "run", kl_exported_in_bits, overrides=STANDARD,
               invariant="exported_as_computed",
               what="the KL gauge divided by ln 2 on its way to the scrape (bits under a name in nats)"),
    PlantedBug("clip_fraction_exported_one_update_late", "telemetry", "run", clip_fraction_exported_one_update_late,
               overrides=STANDARD, env="Pendulum-v1", invariant="exported_as_computed",
               what="the clip fraction's gauge holds the previous update's value"),
    PlantedBug("ray_kl_exported_in_bits", "telemetry", "run", kl_exported_in_bits, overrides=RAY, mode="ray",
               invariant="exported_as_computed", what="as kl_exported_in_bits, with the learner of a Ray run"),
)
