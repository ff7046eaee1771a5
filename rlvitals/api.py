"""The Python API: `rlvitals.train(...)` and `rlvitals.load_policy(...)`.

`train` is `rlvitals train` without a shell: the same config layers, the same
checks before anything is written, the same run directory; it returns the run's
summary (what summary.json holds). `load_policy` gives a checkpoint's network as
an object whose `predict` takes numpy observations, one or a batch, and returns
numpy actions, with the observation normalisation the run used (it is part of
the network's state).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .config import ConfigError, TrainConfig, build_config, load_yaml

API_COMMAND = "rlvitals.train()"
"""What meta.json's command records after the script's name for a run started from Python."""


def make_config(config: TrainConfig | dict | str | os.PathLike | None = None, **fields: Any) -> TrainConfig:
    """A validated TrainConfig: defaults, then `config` (a TrainConfig, a dict of fields or a YAML file's path),
    then `fields`. Values are read as the command line reads them; ConfigError names the first bad one."""
    yaml_path = None
    if config is None or isinstance(config, dict):
        values = {**(config or {}), **fields}
    elif isinstance(config, TrainConfig):
        values = {**config.to_dict(), **fields}
    elif isinstance(config, (str, os.PathLike)):
        yaml_path, values = str(config), dict(fields)
    else:
        raise ConfigError(f"config={config!r} is invalid: expected a TrainConfig, a dict of config fields, "
                          "a YAML file's path, or None")
    in_file = yaml_path is not None and "verbosity" in load_yaml(yaml_path)
    if "verbosity" not in values and not in_file and os.environ.get("RLVITALS_VERBOSITY"):
        values["verbosity"] = os.environ["RLVITALS_VERBOSITY"]  # as the command line: flags, file, then this
    return build_config(yaml_path, values)


def train(config: TrainConfig | dict | str | os.PathLike | None = None, **fields: Any) -> dict:
    """Train as `rlvitals train` does and return the run's summary (the dict summary.json holds).

    `config`: a TrainConfig, a dict of fields, or a YAML file's path; `fields` (keyword
    arguments named as TrainConfig's fields) override it. Invalid values raise ConfigError (a
    ValueError) naming the field and what is accepted, before any run directory is made.
    """
    from .archive import default_run_dir
    from .cli import preflight
    from .report.tensorboard import observers_for
    from .session import run_training

    cfg = make_config(config, **fields)
    if not cfg.run_dir:
        cfg.run_dir = default_run_dir(cfg.env, cfg.seed)
    preflight(cfg)
    return run_training(cfg, [API_COMMAND], observers=observers_for(cfg, cfg.run_dir))


class Policy:
    """A checkpoint's network acting on numpy observations (`load_policy` makes one).

    Attributes: `config` (the run's TrainConfig), `checkpoint` (the file's path), `updates`
    (batches the run had taken then), `observation_space`, `action_space`, `net` (the torch module).
    """

    def __init__(self, loaded):
        self.config, self.net, self.checkpoint, self.updates = loaded.cfg, loaded.net, loaded.path, loaded.updates
        self.observation_space, self.action_space = loaded.observation_space, loaded.action_space

    def seed(self, seed: int) -> None:
        """Seed the draws of `predict(..., deterministic=False)`."""
        self.net.seed(seed)

    def predict(self, obs, deterministic: bool = True) -> np.ndarray:
        """The action for one observation, or actions for a batch (first axis), as numpy.

        deterministic=True: the most likely action (discrete) or the Gaussian's mean (continuous);
        False: drawn from the policy. Continuous actions are clipped to the action space, as the
        actors clip them before stepping the env. ValueError when `obs` fits neither shape.
        """
        import torch

        from .evaluate import acting

        space = self.observation_space
        shape = tuple(space.shape)
        arr = np.asarray(obs, dtype=space.dtype)
        single = arr.shape == shape
        if not single and arr.shape[1:] != shape:
            batch_shape = "(N" + "".join(f", {n}" for n in shape) + ")"
            raise ValueError(f"obs of shape {arr.shape} is invalid: expected one observation of shape {shape} "
                             f"or a batch of shape {batch_shape}")
        batch = torch.from_numpy(np.ascontiguousarray(arr[None] if single else arr))
        actions = acting(self.net, deterministic).act(batch)[0].numpy()
        if hasattr(self.action_space, "low"):
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        return actions[0] if single else actions


def load_policy(run_dir: str | Path | None, checkpoint: str = "latest", env: str | None = None) -> Policy:
    """The policy of a run's checkpoint: latest (default), best or update-<N> of `run_dir`, or a checkpoint
    file's path (run_dir may then be None). ValueError (ConfigError) naming the problem when it cannot be used:
    no such checkpoint, not an rlvitals checkpoint, or a network that does not fit the env's spaces.

    A checkpoint is data: when it was trained on `module:EnvId`, that module is imported only if `env`
    names the same env or the module is imported already (import your env module first, or pass env=)."""
    from .evaluate import open_checkpoint

    return Policy(open_checkpoint(run_dir, checkpoint, env))
