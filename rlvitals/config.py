"""Typed run configuration: defaults, YAML files, command-line overrides, validation.

Every field carries a docstring; the command line's help text is read from
those docstrings, so the two cannot drift apart.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from .config_error import ConfigError
from .config_yaml import AliasRefused, parse_yaml
from .env_kwargs import parse_env_kwargs
from .limits import CONFIG_BYTES_MAX, check_config_limits, check_nesting, read_bounded
from .presets import preset_named, preset_values

VERBOSITY_LEVELS = ("off", "minimal", "standard", "debug")
MODES = ("local", "ray")
AGENTS = ("ppo", "random", "fixed")
DEVICES = ("auto", "cpu", "cuda")
IMAGE_NETWORKS = ("nature", "impala")


RETIRED_FIELDS = {
    "log_every_updates": "metrics.jsonl rows follow a fixed cadence (docs/architecture.md)",
}
"""Fields no longer read, with why. Config files, and the config.yaml and checkpoint of every older run, still
hold them: they load with the field dropped (with a one-line warning for a config file) rather than refused,
so that no run made before becomes impossible to resume or evaluate."""


@dataclass
class TrainConfig:
    # --- run ---
    preset: str = ""
    """Settings for an env family to start from (`rlvitals presets` lists them: classic, mujoco, atari, box2d): they
    replace the defaults, and a config file and flags override them field by field; empty: the defaults (which are
    the classic preset). config.yaml records it."""
    mode: str = "local"
    """`local`: actor and learner in one deterministic process; `ray`: actors spread over a Ray cluster."""
    agent: str = "ppo"
    """`ppo` learns; `random` and `fixed` are probe agents that act through the same actors with learning off."""
    fixed_action: int = 0
    """Index (0 to n-1) of the action the `fixed` probe agent takes (discrete action spaces only); the env receives
    its space's first action plus it."""
    seed: int = 0
    """Seed for torch, numpy and the environments; the same seed reproduces a local run bit for bit on CPU."""
    total_env_steps: int = 200_000
    """Agent steps to collect before the run stops (summed over all envs, reset transitions excluded)."""

    # --- environment ---
    env: str = "CartPole-v1"
    """Gymnasium id of the environment, or `module:EnvId` to import the module that registers it first."""
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for the env's constructor, as `gym.make(env, **env_kwargs)`, for every env of the run
    (actors, checks, eval): JSON or YAML on the command line (`--env-kwargs '{"g": 9.81}'`), a mapping in a config
    file; an empty one passes none."""
    atari_episodic_life: bool = False
    """Atari: end an episode (terminated) when a life is lost."""
    atari_reward_clipping: bool = True
    """Atari: clip rewards to [-1, 1] (reported returns are then clipped too)."""

    # --- actors ---
    num_envs: int = 32
    """Environments stepped together by one actor; policy inference is batched over them."""
    rollout_length: int = 128
    """Steps each env takes per rollout; one rollout of num_envs x rollout_length samples is one learner batch."""

    # --- Ray mode ---
    address: str = ""
    """Ray cluster to join: empty starts a private Ray on this machine (loopback only); `auto` or host:port
    joins one."""
    num_actors: int = 0
    """Ray actors stepping envs; 0 means one per CPU of the cluster, less one for the learner (at least 1)."""
    actor_cpus: float = 1.0
    """CPUs reserved per Ray actor."""
    actor_gpus: float = 0.0
    """GPUs reserved per Ray actor (for GPU envs or GPU inference)."""
    actor_resources: str = ""
    """Ray mode: custom Ray resources reserved per actor, as name=amount pairs joined by commas (e.g. `actor=1`),
    so actors run only on nodes that advertise them (the cluster files in deploy/ give CPU workers `actor`)."""
    sync: bool = False
    """Ray mode: every round, all actors act with the newest weights and the learner waits for all of them."""
    rollouts_in_flight: int = 2
    """Ray mode: rollouts requested ahead per actor, so actors never idle while the learner learns."""
    max_staleness: int = 1000
    """Ray mode: rollouts whose network is more than this many learner steps old are dropped (counted as `stale`)."""
    startup_timeout_seconds: float = 60.0
    """Ray mode: how long actors may take to start before the run stops with what was asked and what exists."""

    # --- PPO with V-trace correction ---
    learning_rate: float = 2.5e-3
    """Adam learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to zero over total_env_steps."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """Lambda of GAE / V-trace: the trade-off between bias (0) and variance (1) of the advantage."""
    update_epochs: int = 4
    """Passes over each batch; every minibatch of every pass is one optimizer step (one network age)."""
    num_minibatches: int = 8
    """Minibatches each batch is split into per epoch."""
    clip_coef: float = 0.2
    """PPO clipping range of the probability ratio."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient norm above which gradients are scaled down."""
    normalize_advantages: bool = True
    """Normalise advantages to zero mean and unit std per minibatch."""
    normalize_observations: bool = False
    """Normalise vector observations by a running mean and std, updated by the learner from each batch after
    learning from it; the statistics are part of the network, so actors, checkpoints and eval use the same ones."""
    normalize_rewards: bool = False
    """Divide the rewards the learner learns from by a running std of each env's discounted return (as SB3's
    VecNormalize); episode returns stay in the env's units."""
    normalize_clip: float = 10.0
    """Normalised observations and scaled rewards are clipped to +-this."""
    vtrace_rho_clip: float = 1.0
    """V-trace rho-bar: truncation of the importance weight on the TD error of stale samples."""
    vtrace_c_clip: float = 1.0
    """V-trace c-bar: truncation of the importance weights that carry corrections backwards in time."""

    # --- network and device ---
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the hidden layers of the vector-observation trunk."""
    image_network: str = "nature"
    """Trunk for image observations: `nature` (the 3-conv Nature-DQN CNN) or `impala` (the IMPALA ResNet:
    3 stages of conv, max-pool and 2 residual blocks, 16/32/32 channels, then 256 units)."""
    recurrent_size: int = 0
    """Width of an LSTM core between the trunk and the heads (0: a feed-forward policy). Actors carry its state
    per env and reset it at episode starts; the learner replays each env's rollout as one sequence from the
    state it began with, so minibatches split the batch by env (num_minibatches must divide num_envs)."""
    device: str = "auto"
    """Learner device: `auto` picks CUDA when present, else CPU."""
    torch_threads: int = 1
    """Torch intra-op threads per process; small networks run fastest on one."""
    mixed_precision: bool = False
    """The learner's training forward and backward passes under bfloat16 autocast on CUDA (ignored on CPU,
    which stays bit-reproducible); targets and the actor-learner check are computed in float32."""

    # --- telemetry and archive ---
    verbosity: str = "standard"
    """Metric detail: off, minimal, standard or debug (also from RLVITALS_VERBOSITY)."""
    metrics_port: int = 0
    """Port of this process's /metrics endpoint; 0 picks a free one."""
    metrics_host: str = "127.0.0.1"
    """Address the /metrics endpoints bind to: loopback unless you mean to expose them; `node` binds each process
    to its node's IP (for Prometheus on a cluster head)."""
    run_dir: str = ""
    """Directory of this run's archive; empty means runs/<env>-<time>-s<seed>."""
    group_readable: bool = False
    """Let the owner's group read the run directory (folders 0750, files 0640); by default it is owner-only
    (0700, 0600), as meta.json names the host and the command line and checkpoints hold the weights."""
    log_interval_seconds: float = 0.5
    """Seconds between refreshes of the progress display."""
    checkpoint_interval: int = 500
    """Learner steps between checkpoints (a final one is always written)."""
    keep_checkpoints: int = 3
    """Checkpoints kept as checkpoints/update-<N>.pt besides latest.pt and best.pt (the highest mean return of the
    last 100 episodes at a checkpoint write); older ones are removed, 0 keeps none."""
    return_threshold: float | None = None
    """Mean return over the last 100 episodes that counts as solved; its time is reported in summary.json."""
    stop_at_threshold: bool = False
    """End the run as soon as return_threshold is reached."""
    max_nonfinite_batches: int = 10
    """Consecutive batches with NaN/inf (skipped, never learned from) after which the run stops."""
    progress: bool = True
    """Show the live progress line in the terminal."""
    tensorboard: bool = False
    """Also write TensorBoard event files into the run directory, one event per metrics row
    (`tensorboard --logdir runs`)."""

    # ---------------------------------------------------------------- derived
    @property
    def batch_size(self) -> int:
        return self.num_envs * self.rollout_length

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["hidden_sizes"] = list(self.hidden_sizes)
        return out

    # ------------------------------------------------------------- validation
    def validate(self) -> TrainConfig:
        """Raise ConfigError naming the first bad value; return self when all are good."""
        if self.preset:
            preset_named(self.preset)
        _choice("mode", self.mode, MODES)
        _choice("agent", self.agent, AGENTS)
        _choice("verbosity", self.verbosity, VERBOSITY_LEVELS)
        _choice("device", self.device, DEVICES)
        _choice("image_network", self.image_network, IMAGE_NETWORKS)
        for name in ("total_env_steps", "num_envs", "rollout_length", "update_epochs",
                     "num_minibatches", "torch_threads", "checkpoint_interval",
                     "rollouts_in_flight", "max_staleness", "max_nonfinite_batches"):
            _positive_int(name, getattr(self, name))
        for name in ("learning_rate", "clip_coef", "max_grad_norm", "vtrace_rho_clip",
                     "vtrace_c_clip", "log_interval_seconds", "normalize_clip"):
            _positive_float(name, getattr(self, name))
        if isinstance(self.num_actors, bool) or not isinstance(self.num_actors, int) or self.num_actors < 0:
            raise ConfigError(f"num_actors={self.num_actors!r} is invalid: expected an integer >= 0 (0: one per CPU)")
        for name in ("actor_cpus", "actor_gpus"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name}={value!r} is invalid: expected a finite number >= 0")
        parse_resources(self.actor_resources)
        parse_env_kwargs(self.env_kwargs)  # names the env refuses are found where it is built
        _positive_float("startup_timeout_seconds", self.startup_timeout_seconds)
        for name in ("value_coef", "entropy_coef"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name}={value!r} is invalid: expected a finite number >= 0")
        for name in ("gamma", "gae_lambda"):
            value = getattr(self, name)
            if not (0.0 <= value <= 1.0):
                raise ConfigError(f"{name}={value!r} is invalid: expected a number in [0, 1]")
        if not self.hidden_sizes or any(int(h) <= 0 for h in self.hidden_sizes):
            raise ConfigError(
                f"hidden_sizes={list(self.hidden_sizes)!r} is invalid: expected one or more positive integers")
        if self.batch_size % self.num_minibatches:
            raise ConfigError(
                f"num_minibatches={self.num_minibatches} is invalid: it must divide the batch "
                f"num_envs*rollout_length={self.batch_size}")
        if isinstance(self.recurrent_size, bool) or not isinstance(self.recurrent_size, int) \
                or self.recurrent_size < 0:
            raise ConfigError(f"recurrent_size={self.recurrent_size!r} is invalid: expected an integer >= 0 "
                              "(0: feed-forward)")
        if self.recurrent_size and self.num_envs % self.num_minibatches:
            raise ConfigError(
                f"num_minibatches={self.num_minibatches} is invalid with recurrent_size={self.recurrent_size}: "
                f"minibatches split the batch by env, so it must divide num_envs={self.num_envs}")
        if isinstance(self.keep_checkpoints, bool) or not isinstance(self.keep_checkpoints, int) \
                or self.keep_checkpoints < 0:
            raise ConfigError(f"keep_checkpoints={self.keep_checkpoints!r} is invalid: expected an integer >= 0 "
                              "(0: latest.pt and best.pt only)")
        if not (0 <= self.metrics_port <= 65535):
            raise ConfigError(f"metrics_port={self.metrics_port} is invalid: expected 0 (any free port) to 65535")
        if not self.env or not isinstance(self.env, str):
            raise ConfigError(f"env={self.env!r} is invalid: expected a gymnasium id such as CartPole-v1")
        if self.return_threshold is not None and not math.isfinite(self.return_threshold):
            raise ConfigError(f"return_threshold={self.return_threshold!r} is invalid: expected a finite number")
        check_config_limits(self)  # seeds, counters, threads and envs no machine can hold
        return self


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is invalid: expected one of {', '.join(allowed)}")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name}={value!r} is invalid: expected an integer > 0")


def _positive_float(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name}={value!r} is invalid: expected a finite number > 0")


def parse_resources(text: str) -> dict[str, float]:
    """`actor_resources` as a dict: "actor=1,fast=0.5" -> {"actor": 1.0, "fast": 0.5}; "" -> {}."""
    problem = ("expected name=amount pairs joined by commas, e.g. actor=1, with amounts finite and > 0 "
               "(CPUs and GPUs go in actor_cpus and actor_gpus)")
    out: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")) if text.strip() else ():
        name, sep, amount = (piece.strip() for piece in item.partition("="))
        try:
            value = float(amount)
        except ValueError:
            value = math.nan
        reserved = name in ("CPU", "GPU", "memory") or name in out
        if not sep or not name or reserved or not (math.isfinite(value) and value > 0):
            raise ConfigError(f"actor_resources={text!r} is invalid: {problem}")
        out[name] = value
    return out


# ------------------------------------------------------------------ field docs
def field_docs(cls: type = TrainConfig) -> dict[str, str]:
    """Map each dataclass field to the docstring written under it."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, following in zip(body, body[1:], strict=False):  # each statement with the one after it
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def field_types() -> dict[str, Any]:
    return get_type_hints(TrainConfig)


def coerce(name: str, raw: Any) -> Any:
    """Turn a YAML or command-line value into the field's type, or raise ConfigError."""
    hint = field_types()[name]
    text = str(raw)
    if hint == dict[str, Any]:
        return parse_env_kwargs(raw)  # its own one-line errors
    try:
        if hint is bool:
            if isinstance(raw, bool):
                return raw
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if hint is int:
            if isinstance(raw, float):   # a YAML number such as 1e3; beyond 2**53 a float is no exact integer
                if raw.is_integer() and abs(raw) < 2**53:
                    return int(raw)
                raise ValueError
            if isinstance(raw, bool):
                raise ValueError
            return int(text.replace("_", ""))
        if hint is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(text)
        if hint == (float | None):
            if raw is None or text.lower() in ("none", "null", ""):
                return None
            return float(text)
        if hint == tuple[int, ...]:
            items = raw if isinstance(raw, (list, tuple)) else [p for p in text.replace(" ", "").split(",") if p]
            return tuple(int(x) for x in items)
        return text
    except (TypeError, ValueError):
        kind = {bool: "true or false", int: "an integer", float: "a number"}.get(hint, "a list of integers like 64,64")
        if hint == (float | None):
            kind = "a number or none"
        raise ConfigError(f"{name}={raw!r} is invalid: expected {kind}") from None


def load_yaml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """The mapping a YAML file holds (a config file, or a run directory's config.yaml: `what` names it).

    The one way rlvitals reads a YAML file: a regular file of at most CONFIG_BYTES_MAX, read with the
    one loader (config_yaml: no aliases, no duplicate keys, bounded nesting). ConfigError, one line, for
    anything else, whoever wrote the file."""
    try:
        data = parse_yaml(read_bounded(path, CONFIG_BYTES_MAX, what).decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"{what} {str(path)!r} is unreadable: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                          f"offset {exc.start}); expected a YAML file of field: value lines") from None
    except AliasRefused as exc:
        raise ConfigError(f"{what} {str(path)!r} is invalid: {exc}") from None
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" at line {line + 1}" if line is not None else ""
        raise ConfigError(f"{what} {str(path)!r} is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {str(path)!r} is invalid: expected a mapping of field: value")
    return data


def build_config(yaml_path: str | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, then the preset, then the YAML file, then command-line overrides; validated.

    The preset is the overrides' `preset` when they name one, else the file's: a flag chooses it over the file,
    and the file's own values still stand above it."""
    values: dict[str, Any] = {}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    file_values = load_yaml(yaml_path) if yaml_path else {}
    overrides = overrides or {}
    chosen = overrides.get("preset", file_values.get("preset"))
    preset = coerce("preset", chosen) if chosen is not None else ""
    for layer in (preset_values(preset), file_values, overrides):
        for name, raw in layer.items():
            if name in RETIRED_FIELDS:
                if layer is file_values:
                    logging.getLogger(__name__).warning("config file %r: %s is ignored and may be removed: %s",
                                                        str(yaml_path), name, RETIRED_FIELDS[name])
                continue
            if name not in known:
                raise ConfigError(f"unknown config field {name!r}: expected one of {', '.join(sorted(known))}")
            check_nesting(name, raw)  # before anything walks or prints it recursively
            values[name] = coerce(name, raw)
    return TrainConfig(**values).validate()
