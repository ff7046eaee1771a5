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


def counter_state(telemetry) -> list:
    """[[name, [label values], value], ...] for every counter the recorder holds."""
    if telemetry is None:
        return []
    from rlvitals.telemetry.catalogue import BY_NAME

    with telemetry.recorder.lock:
        return [[name, list(labels), value] for (name, labels), value in telemetry.recorder.values.items()
                if name in BY_NAME and BY_NAME[name].kind == "counter"]


def save_checkpoint(archive: RunArchive, cfg, net, learner, tracker, telemetry=None) -> None:
    archive.save_checkpoint({
        "config": cfg.to_dict(),
        "network": net.state_dict(),
        "optimizer": learner.optimizer.state_dict(),
        "age": net.age,
        "tracker": {"env_steps": tracker.env_steps, "episodes": tracker.episodes, "updates": tracker.updates,
                    "window": list(tracker.window), "elapsed": tracker.elapsed,
                    "solved_after_s": tracker.solved_after_s, "solved_at_env_steps": tracker.solved_at_env_steps},
        "learner": {"samples_learned": learner.samples_learned, "updates": learner.updates,
                    "nonfinite_batches": learner.nonfinite_batches},
        "rng": rng_state(net, learner),
        "counters": counter_state(telemetry),
    })


def restore(state: dict, net, learner, tracker, telemetry=None) -> None:
    """Put network, optimizer, counters, RNGs and Prometheus counters back as the checkpoint has them."""
    net.load_state_dict(state["network"])
    net.age = int(state["age"])
    learner.optimizer.load_state_dict(state["optimizer"])
    t = state["tracker"]
    tracker.env_steps, tracker.episodes, tracker.updates = t["env_steps"], t["episodes"], t["updates"]
    tracker.window.extend(t["window"])
    tracker.resume_offset = float(t["elapsed"])
    tracker.solved_after_s, tracker.solved_at_env_steps = t["solved_after_s"], t["solved_at_env_steps"]
    for key, value in state["learner"].items():
        setattr(learner, key, value)
    restore_rng(state["rng"], net, learner)
    if telemetry is not None:
        restore_counters(telemetry, state)
        telemetry.recorder.record_age(net.age)


def restore_counters(telemetry, state: dict) -> None:
    """Counters continue from the checkpoint; done before the endpoint's first answer, so no scrape sees a reset."""
    rec = telemetry.recorder
    with rec.lock:
        for name, labels, value in state["counters"]:
            if name in rec.enabled:
                rec.values[(name, tuple(labels))] = float(value)
        rec.collected = float(state["tracker"]["env_steps"])
        rec.learned = float(state["learner"]["samples_learned"])
