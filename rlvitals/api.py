"""The Python API: `rlvitals.train(...)` and `rlvitals.load_policy(...)`.

`train` is `rlvitals train` without a shell: the same config layers, the same
checks before anything is written, the same run directory; it returns the run's
summary (what summary.json holds). `load_policy` gives a checkpoint's network as
an object whose `predict` takes numpy observations, one or a batch, and returns
numpy actions, with the observation normalisation the run used (it is part of
the network's state); a recurrent policy's `predict` also takes and returns the
state it carries, as sb3-contrib's RecurrentPPO does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .config import ConfigError, TrainConfig, build_config, load_yaml

API_COMMAND = "rlvitals.train()"
"""What meta.json's command records after the script's name for a run started from Python."""


def fields_set(config: TrainConfig) -> dict[str, Any]:
    """The fields of `config` that differ from TrainConfig's defaults, its preset included.

    A TrainConfig does not know which of its fields were given: one at its default is read as not given, so the
    preset (the config's own, or a `preset=` keyword) sets it, as it would under a config file. A field meant to
    keep its default value under a preset is passed as a keyword: `train(cfg, learning_rate=2.5e-4)`."""
    defaults = TrainConfig().to_dict()
    return {name: value for name, value in config.to_dict().items() if value != defaults[name]}


def make_config(config: TrainConfig | dict | str | os.PathLike | None = None, **fields: Any) -> TrainConfig:
    """A validated TrainConfig: defaults, then the preset, then `config` (a TrainConfig, a dict of fields or a YAML
    file's path), then `fields`. Values are read as the command line reads them; ConfigError names the first bad
    one. A TrainConfig's fields at their defaults are open to the preset (`fields_set`)."""
    yaml_path = None
    if config is None or isinstance(config, dict):
        values = {**(config or {}), **fields}
    elif isinstance(config, TrainConfig):
        values = {**fields_set(config), **fields}
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

    @property
    def recurrent(self) -> bool:
        """True for a recurrent policy (trained with recurrent_size > 0): `predict` then takes and returns a state."""
        return bool(self.config.recurrent_size)

    @property
    def state_shape(self) -> tuple[int, ...] | None:
        """The state of one env, (2 * cores, recurrent_size): each LSTM core's h and c; None when feed-forward."""
        return tuple(self.net.initial_state(1).shape[1:]) if self.recurrent else None

    def predict(self, obs, state=None, episode_start=None, deterministic: bool = True):
        """The action for one observation, or actions for a batch (first axis), as numpy.

        deterministic=True: the most likely action (discrete) or the Gaussian's mean (continuous);
        False: drawn from the policy. Continuous actions are clipped to the action space, as the
        actors clip them before stepping the env.

        A recurrent policy returns `(actions, state)`, as sb3-contrib's RecurrentPPO: pass the state back
        with the next observations. `state=None` is the empty state; `episode_start` (a bool, or one per
        observation) marks observations that begin an episode, where the state is emptied before the step
        (None: none begins one). A feed-forward policy returns the actions alone; it has no state, so
        `state` must be None and `episode_start` changes nothing. ValueError, one line, when `obs`,
        `state` or `episode_start` has a shape that fits neither one observation nor the batch.
        """
        import torch

        from .evaluate import acting

        batch, single = self._observations(obs)
        starts = self._episode_starts(episode_start, len(batch), single)
        policy = acting(self.net, deterministic)
        if not self.recurrent:
            if state is not None:
                raise ValueError(f"state of type {type(state).__name__} is invalid: this policy is feed-forward "
                                 "(recurrent_size=0) and carries no state; expected state=None")
            return self._actions(policy.act(batch)[0], single)
        carried = self._state(state, len(batch), single)
        with torch.no_grad():
            actions, _, _, after = policy.act_recurrent(batch, carried, starts)
        after = after.numpy()
        return self._actions(actions, single), after[0] if single else after

    def _observations(self, obs):
        """(a batch tensor, whether `obs` was one observation); ValueError when it fits neither shape."""
        import torch

        space = self.observation_space
        shape = tuple(space.shape)
        arr = np.asarray(obs, dtype=space.dtype)
        single = arr.shape == shape
        if not single and arr.shape[1:] != shape:
            batch_shape = "(N" + "".join(f", {n}" for n in shape) + ")"
            raise ValueError(f"obs of shape {arr.shape} is invalid: expected one observation of shape {shape} "
                             f"or a batch of shape {batch_shape}")
        return torch.from_numpy(np.ascontiguousarray(arr[None] if single else arr)), single

    def _actions(self, actions, single: bool) -> np.ndarray:
        actions = actions.numpy()
        if hasattr(self.action_space, "low"):
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        else:
            actions = actions + int(getattr(self.action_space, "start", 0))   # the env's first action, as the actors
        return actions[0] if single else actions

    @staticmethod
    def _episode_starts(episode_start, n: int, single: bool):
        """[n] bool tensor (all False for None); ValueError unless one flag per observation."""
        import torch

        if episode_start is None:
            return torch.zeros(n, dtype=torch.bool)
        flags = np.asarray(episode_start)
        accepted = [(), (1,)] if single else [(n,)]
        if flags.dtype.kind not in "bui" or flags.shape not in accepted:
            expected = "a bool or an array of shape (1,)" if single else f"an array of {n} bools, shape ({n},)"
            raise ValueError(f"episode_start of shape {flags.shape} and dtype {flags.dtype} is invalid: expected "
                             f"{expected} (one flag per observation), or None")
        return torch.from_numpy(flags.astype(bool).reshape(n))

    def _state(self, state, n: int, single: bool):
        """[n, 2 * cores, H] float32 tensor (the empty state for None); ValueError for any other shape."""
        import torch

        if state is None:
            return self.net.initial_state(n)
        one = self.state_shape
        expected = one if single else (n, *one)
        try:
            arr = np.asarray(state, dtype=np.float32)
        except (TypeError, ValueError):
            arr = None
        if arr is None or arr.shape != expected:
            shape = "of type " + type(state).__name__ if arr is None else f"of shape {arr.shape}"
            what = "one observation's" if single else f"a batch of {n} observations'"
            raise ValueError(f"state {shape} is invalid: expected {what} state, shape {expected} (the state "
                             "predict returned last, for the same observations' envs), or None for the empty state")
        return torch.from_numpy(np.ascontiguousarray(arr.reshape(n, *one)))


def load_policy(run_dir: str | Path | None, checkpoint: str = "latest", env: str | None = None) -> Policy:
    """The policy of a run's checkpoint: latest (default), best or update-<N> of `run_dir`, or a checkpoint
    file's path (run_dir may then be None). ValueError (ConfigError) naming the problem when it cannot be used:
    no such checkpoint, not an rlvitals checkpoint, or a network that does not fit the env's spaces.

    A checkpoint is data: when it was trained on `module:EnvId`, that module is imported only if `env`
    names the same env or the module is imported already (import your env module first, or pass env=)."""
    from .evaluate import open_checkpoint

    return Policy(open_checkpoint(run_dir, checkpoint, env))
