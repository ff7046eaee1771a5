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
from .resume_check import fingerprint, resume_gaps

RESUMABLE_FIELDS = {"total_env_steps", "verbosity", "metrics_port", "metrics_host", "progress",
                    "log_interval_seconds", "checkpoint_interval", "address", "num_actors",
                    "actor_cpus", "actor_gpus", "actor_resources", "rollouts_in_flight", "max_nonfinite_batches",
                    "return_threshold", "stop_at_threshold", "startup_timeout_seconds", "device", "run_dir",
                    "tensorboard", "group_readable", "keep_checkpoints"}


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


def save_checkpoint(archive: RunArchive, cfg, net, learner, tracker, telemetry, invariants=None) -> None:
    """`tracker`, `telemetry` and `invariants` (the run's invariant monitor) give their own state, as plain data;
    the fingerprint of the live state beside it is what a resume is checked against (rlvitals/resume_check.py)."""
    rng = rng_state(net, learner)
    archive.save_checkpoint({
        "run_id": archive.run_id,
        "config": cfg.to_dict(),
        "network": net.state_dict(),
        "optimizer": learner.optimizer.state_dict(),
        "age": net.age,
        "tracker": tracker.state(),
        "learner": {"samples_learned": learner.samples_learned, "updates": learner.updates,
                    "nonfinite_batches": learner.nonfinite_batches},
        "learner_state": learner.extra_state(),  # the run's reward scale and noise-scale averages
        "rng": rng,
        "telemetry": telemetry.state(),
        "invariants": invariants.state() if invariants is not None else {},
        "fingerprint": fingerprint(net, learner, tracker, rng),
    }, mean_return=tracker.mean_return())  # judges best.pt


def check_resumable(run_dir, state: dict) -> None:
    """ConfigError (one line) unless `state` is this run directory's own checkpoint and fits its env as it is now.

    Checked, in order: no live process holds the directory; the checkpoint's config agrees
    with config.yaml on every field a resume may not change (env first); its run id (where
    it has one) is the directory's; and the network it holds has the shapes a network for
    the env's current observation and action spaces has.
    """
    from pathlib import Path

    from .archive import check_not_busy
    from .config import RETIRED_FIELDS, ConfigError, load_yaml

    path = Path(run_dir)
    check_not_busy(path)
    ckpt = path / "checkpoints" / "latest.pt"
    archive = RunArchive(path)
    saved = load_yaml(path / "config.yaml", what="config.yaml")  # its own one line for a hostile file
    try:
        run_id = archive.run_id
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"resume={str(path)!r} is invalid: its meta.json or config.yaml cannot be read; "
                          "expected a run directory written by rlvitals train") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"resume={str(path)!r} is invalid: its config.yaml is not a mapping of config fields")
    config = state["config"]
    if not isinstance(config, dict) or not isinstance(state["network"], dict):
        raise ConfigError(f"checkpoint {str(ckpt)!r} is not an rlvitals checkpoint: its config or network is malformed")
    fields = sorted(set(config) & set(saved) - RESUMABLE_FIELDS - set(RETIRED_FIELDS),
                    key=lambda name: (name != "env", name))
    for name in fields:
        if _plain(config[name]) != _plain(saved[name]):
            raise ConfigError(f"checkpoint {str(ckpt)!r} was written with {name}={config[name]!r} but run {run_id} "
                              f"has {name}={saved[name]!r} in config.yaml; expected the run's own checkpoint")
    if state.get("run_id") not in (None, run_id):
        raise ConfigError(f"checkpoint {str(ckpt)!r} belongs to run {state['run_id']}, not to run {run_id} of "
                          f"{str(path)!r}; expected the run's own checkpoint")
    check_network_fits(ckpt, state)


def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def check_network_fits(ckpt, state: dict) -> None:
    """ConfigError unless a network built for the env as it is now has the checkpoint's tensor names and shapes."""
    from .config import ConfigError, TrainConfig
    from .parts import env_spaces, make_network

    known = {f for f in TrainConfig.__dataclass_fields__}
    cfg = TrainConfig(**{k: v for k, v in state["config"].items() if k in known})
    cfg.hidden_sizes = tuple(cfg.hidden_sizes)
    check_recurrent_size(ckpt, cfg.recurrent_size, state["network"])
    obs_space, action_space = env_spaces(cfg)
    with torch.device("meta"):  # shapes only: no memory, no initialisation (seconds for wide layers)
        now = {name: tuple(t.shape) for name, t in make_network(cfg, obs_space, action_space).state_dict().items()}
    then = {name: tuple(t.shape) for name, t in state["network"].items()}
    for name in sorted(set(now) | set(then)):
        if now.get(name) != then.get(name):
            have = "absent" if name not in then else list(then[name])
            need = "absent" if name not in now else list(now[name])
            raise ConfigError(
                f"checkpoint {str(ckpt)!r} does not fit env {cfg.env!r} as it is now (observation space "
                f"{obs_space}, action space {action_space}): network tensor {name} is {have} in the checkpoint "
                f"and {need} for the env; expected the env the run was trained on")


RECURRENT_CORE_WEIGHT = "cores.0.lstm.weight_hh_l0"
"""The first LSTM core's hidden-to-hidden weights, [4 H, H]: the network's recurrent_size H (absent: 0)."""


def check_recurrent_size(ckpt, configured: int, network: dict) -> None:
    """ConfigError naming recurrent_size when the checkpoint's network has another LSTM width than its config
    says: every tensor would then mismatch, and the per-tensor message would blame the env."""
    from .config import ConfigError

    weight = network.get(RECURRENT_CORE_WEIGHT)
    held = int(weight.shape[-1]) if getattr(weight, "ndim", 0) == 2 else 0
    if held != configured:
        raise ConfigError(f"checkpoint {str(ckpt)!r} holds a network of recurrent_size={held} but its config has "
                          f"recurrent_size={configured}; expected a checkpoint whose network and config agree "
                          "(as rlvitals writes them)")


def restore(state: dict, net, learner, tracker) -> dict[str, float]:
    """Put network, optimizer, the run's counters and RNGs back as the checkpoint has them; return the resume
    invariants' statistics: the state now against the fingerprint saved with it ({} for a checkpoint without).

    The telemetry's counters are given back separately (`telemetry_state`), by whoever
    starts the telemetry, before its endpoint first answers.
    """
    net.load_state_dict(state["network"])
    net.age = int(state["age"])
    learner.optimizer.load_state_dict(state["optimizer"])
    tracker.load_state(state["tracker"])
    for key, value in state["learner"].items():
        setattr(learner, key, value)
    if "learner_state" in state:  # checkpoints written before it existed resume with fresh scales
        learner.load_extra_state(state["learner_state"])
    restore_rng(state["rng"], net, learner)
    return resume_gaps(state.get("fingerprint"), fingerprint(net, learner, tracker, rng_state(net, learner)))


def telemetry_state(state: dict) -> dict:
    """What a checkpoint holds for the telemetry's `load_state`, checkpoints from before `telemetry` included.

    Where the run was at verbosity off (no telemetry state), the sample totals that the
    training-intensity gauge needs are taken from the run's own counters.
    """
    saved = dict(state.get("telemetry") or {"counters": state.get("counters", [])})
    saved.setdefault("collected", float(state["tracker"]["env_steps"]))
    saved.setdefault("learned", float(state["learner"]["samples_learned"]))
    return saved
