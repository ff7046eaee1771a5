"""What a checkpoint holds, and putting a run back the way it was.

A checkpoint is everything needed to continue: network, optimizer, network
age, the run's counters and recent episodes, every RNG state, the config, and
the running totals of the run's Prometheus counters (so a resumed run's
counters continue instead of restarting from zero). Only tensors and plain
data go in, so it loads with `weights_only=True`.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from .archive import RunArchive

RESUMABLE_FIELDS = {"total_env_steps", "verbosity", "metrics_port", "metrics_host", "progress",
                    "log_interval_seconds", "log_every_updates", "checkpoint_interval", "address", "num_actors",
                    "actor_cpus", "actor_gpus", "actor_resources", "rollouts_in_flight", "max_nonfinite_batches",
                    "return_threshold", "stop_at_threshold", "startup_timeout_seconds", "device", "run_dir"}


def rng_state(net, learner) -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached": float(cached)},
        "python": list(random.getstate()[1]) + [random.getstate()[2]] if random.getstate()[2] is not None
        else list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "sampler": net.generator.get_state(),
        "minibatch": learner.generator.get_state(),
    }


def restore_rng(state: dict, net, learner) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    internal = state["python"]
    gauss = internal[625] if len(internal) > 625 else None
    random.setstate((state["python_version"], tuple(internal[:625]), gauss))
    net.generator.set_state(state["sampler"])
    learner.generator.set_state(state["minibatch"])


def save_checkpoint(archive: RunArchive, cfg, net, learner, tracker, telemetry) -> None:
    """`tracker` and `telemetry` give their own state (`state()`), as plain data."""
    archive.save_checkpoint({
        "config": cfg.to_dict(),
        "network": net.state_dict(),
        "optimizer": learner.optimizer.state_dict(),
        "age": net.age,
        "tracker": tracker.state(),
        "learner": {"samples_learned": learner.samples_learned, "updates": learner.updates,
                    "nonfinite_batches": learner.nonfinite_batches},
        "rng": rng_state(net, learner),
        "telemetry": telemetry.state(),
    })


def restore(state: dict, net, learner, tracker) -> None:
    """Put network, optimizer, the run's counters and RNGs back as the checkpoint has them.

    The telemetry's counters are given back separately (`telemetry_state`), by whoever
    starts the telemetry, before its endpoint first answers.
    """
    net.load_state_dict(state["network"])
    net.age = int(state["age"])
    learner.optimizer.load_state_dict(state["optimizer"])
    tracker.load_state(state["tracker"])
    for key, value in state["learner"].items():
        setattr(learner, key, value)
    restore_rng(state["rng"], net, learner)


def telemetry_state(state: dict) -> dict:
    """What a checkpoint holds for the telemetry's `load_state`, checkpoints from before `telemetry` included.

    Where the run was at verbosity off (no telemetry state), the sample totals that the
    training-intensity gauge needs are taken from the run's own counters.
    """
    saved = dict(state.get("telemetry") or {"counters": state.get("counters", [])})
    saved.setdefault("collected", float(state["tracker"]["env_steps"]))
    saved.setdefault("learned", float(state["learner"]["samples_learned"]))
    return saved
