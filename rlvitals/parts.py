"""Building the parts of a run from its config: device, seeds, network, agent, learner.

Both run modes (and the Ray actor bodies, and `rlvitals eval`) build their
parts through these functions, so a config means the same network and the
same learner everywhere.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
import torch

from rlvitals.actors.agents import FixedActionAgent, RandomAgent
from rlvitals.learner.networks import ActorCritic
from rlvitals.learner.ppo import PPOLearner, PPOSettings

from .config_error import ConfigError

if TYPE_CHECKING:   # annotations only: config.py's checks call into this module
    from .config import TrainConfig


def resolve_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' is invalid: no CUDA GPU is visible; expected auto or cpu")
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def seed_everything(seed: int, threads: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)


def env_spaces(cfg: TrainConfig):
    """(observation space, action space) of one env of the config, from a throwaway vector env."""
    from rlvitals.actors.envs import make_vector_env

    env = make_vector_env(cfg.env, 1, env_kwargs=cfg.env_kwargs)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


def make_network(cfg: TrainConfig, obs_space, action_space) -> ActorCritic:
    """ConfigError (one line) where the config asks for something this env's spaces do not allow."""

    try:
        net = ActorCritic(obs_space, action_space, cfg.hidden_sizes, image_network=cfg.image_network,
                          normalize_observations=cfg.normalize_observations, normalize_clip=cfg.normalize_clip,
                          recurrent_size=cfg.recurrent_size)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    net.seed(cfg.seed)
    return net


def return_discount(cfg: TrainConfig) -> float | None:
    """What the env runner needs for reward scaling: the discount of the running return it keeps (None: off)."""
    return cfg.gamma if cfg.normalize_rewards and cfg.agent == "ppo" else None


def make_agent(cfg: TrainConfig, runner, net: ActorCritic):
    """The policy the actors act with: the network, or a probe agent."""
    if cfg.agent == "random":
        return RandomAgent(runner.action_space, cfg.seed)
    if cfg.agent == "fixed":
        return FixedActionAgent(runner.action_space, cfg.fixed_action)
    return net


def ppo_settings(cfg: TrainConfig) -> PPOSettings:
    """The learner's settings from the config; those the config does not hold (Adam's betas and epsilon) keep
    the learner's defaults."""
    return PPOSettings(**{f: getattr(cfg, f) for f in PPOSettings.__dataclass_fields__ if hasattr(cfg, f)})


def make_learner(cfg: TrainConfig, net: ActorCritic, device: torch.device, telemetry=None) -> PPOLearner:
    """The PPO learner; `telemetry` (anything with `wants_value_trace`/`wants_debug`) says what extra to compute."""
    from rlvitals.telemetry.catalogue import SIGNED_BUCKETS

    return PPOLearner(net, ppo_settings(cfg), device, cfg.seed,
                      value_trace=bool(getattr(telemetry, "wants_value_trace", False)),
                      debug=bool(getattr(telemetry, "wants_debug", False)), hist_bounds=SIGNED_BUCKETS)


class DevicePolicy:
    """Acts with a network that lives on another device (local mode with a GPU learner)."""

    def __init__(self, net: ActorCritic, device: torch.device):
        self.net, self.device = net, device

    @property
    def age(self) -> int:
        return self.net.age

    def weights_checksum(self) -> float:
        return self.net.weights_checksum()

    @torch.no_grad()
    def forward(self, obs):
        """The network's policy forward pass alone, on its device (the inference phase's reference cost)."""
        return self.net.policy_params(obs.to(self.device, non_blocking=True)).float().cpu()

    @torch.no_grad()
    def act(self, obs):
        # The forward pass runs on the learner's device; the sampling runs on the CPU with the network's
        # own CPU generator, so the draws are the same stream as on a CPU learner and a resumed run's
        # sampler state (a CPU generator's) still applies.
        params = self.net.policy_params(obs.to(self.device, non_blocking=True)).float().cpu()
        actions, logp = self.net.dist.sample(params, self.net.generator)
        return actions, params, logp

    @property
    def recurrent_size(self) -> int:
        return self.net.recurrent_size

    def initial_state(self, n: int) -> torch.Tensor:
        return self.net.initial_state(n)

    @torch.no_grad()
    def act_recurrent(self, obs, state, starts):
        """As `act`, one step on from each env's state; the state lives with the runner, on the host."""
        dev = self.device
        params, _, state = self.net.step(obs.to(dev, non_blocking=True), state.to(dev), starts.to(dev))
        params = params.float().cpu()
        actions, logp = self.net.dist.sample(params, self.net.generator)
        return actions, params, logp, state.float().cpu()
