"""Actor-critic networks whose intake and output heads come from the env's spaces."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .normalize import ObservationNormalizer
from .recurrent import RecurrentCore


def _init(layer: nn.Module, gain: float) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def float64_sums(tensors) -> tuple[float, float]:
    """The float64 sum of the tensors' values and of their squares, over all of them at once (0, 0 for none): a
    fingerprint the same values give exactly, in any process."""
    flat = [t.detach().reshape(-1) for t in tensors if torch.is_tensor(t) and t.numel()]
    if not flat:
        return 0.0, 0.0
    x = torch.cat(flat).double()   # one reduction, not one per tensor
    return float(x.sum()), float(x.square().sum())


class Categorical:
    """Discrete actions; parameters are logits [B, n]."""

    def __init__(self, n: int):
        self.n = n
        self.num_params = n
        self.max_entropy = math.log(n) if n > 1 else 1.0  # one action: entropy 0 of 1 -> relative 0
        self.entropy_bounded = True
        """The entropy has a maximum (log n), so 'at its maximum' and 'a share of it' mean something."""
        self.dims = 1

    def log_prob(self, params, actions):
        return F.log_softmax(params, -1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, params):
        logp = F.log_softmax(params, -1)
        return -(logp.exp() * logp).sum(-1)

    def kl(self, p_params, q_params):
        """KL(p || q), exact and never negative."""
        logp, logq = F.log_softmax(p_params, -1), F.log_softmax(q_params, -1)
        return (logp.exp() * (logp - logq)).sum(-1).clamp_min(0.0)

    def sample(self, params, generator):
        actions = torch.multinomial(F.softmax(params, -1), 1, generator=generator).squeeze(-1)
        return actions, self.log_prob(params, actions)


class DiagGaussian:
    """Continuous actions; parameters are [mean, log_std] concatenated, [B, 2A]."""

    def __init__(self, space: gym.spaces.Box):
        self.dim = int(space.shape[0])
        self.num_params = 2 * self.dim
        bounded = np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))
        # Reference: the uniform distribution over a bounded box has the most entropy
        # a policy there can usefully have; unbounded boxes use a unit Gaussian.
        self.max_entropy = (float(np.log(space.high - space.low).sum()) if bounded
                            else 0.5 * self.dim * math.log(2 * math.pi * math.e))
        self.entropy_bounded = False
        """A Gaussian's entropy has no maximum: max_entropy is a reference scale only, which a wide policy
        exceeds; rules judge its change from the initial policy instead."""
        self.dims = self.dim

    def _split(self, params):
        return params[..., : self.dim], params[..., self.dim:]

    def log_prob(self, params, actions):
        mean, log_std = self._split(params)
        z = (actions - mean) / log_std.exp()
        return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self, params):
        _, log_std = self._split(params)
        return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    def kl(self, p_params, q_params):
        mp, lp = self._split(p_params)
        mq, lq = self._split(q_params)
        kl = lq - lp + (torch.exp(2 * lp) + (mp - mq).pow(2)) / (2 * torch.exp(2 * lq)) - 0.5
        return kl.sum(-1).clamp_min(0.0)

    def sample(self, params, generator):
        mean, log_std = self._split(params)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
        actions = mean + log_std.exp() * noise
        return actions, self.log_prob(params, actions)


NATURE_MIN_SIZE = 36
"""The smallest side the Nature trunk takes: 8x8 stride 4, 4x4 stride 2 and 3x3 leave one pixel of 36."""


class ImageIntake(nn.Module):
    """Nature-DQN convolutional trunk for uint8 images (HWC or CHW)."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        channels_last = shape[-1] <= 4 < shape[0]
        self.channels_last = channels_last
        c = shape[-1] if channels_last else shape[0]
        self.conv = nn.Sequential(
            _init(nn.Conv2d(c, 32, 8, 4), math.sqrt(2)), nn.ReLU(),
            _init(nn.Conv2d(32, 64, 4, 2), math.sqrt(2)), nn.ReLU(),
            _init(nn.Conv2d(64, 64, 3, 1), math.sqrt(2)), nn.ReLU(), nn.Flatten())
        height, width = (shape[0], shape[1]) if channels_last else (shape[1], shape[2])
        if min(height, width) < NATURE_MIN_SIZE:   # its three convolutions would leave nothing to flatten
            raise ValueError(f"image_network='nature' is invalid for {height}x{width} images (observation shape "
                             f"{shape}): its convolutions need at least {NATURE_MIN_SIZE}x{NATURE_MIN_SIZE}; "
                             "expected image_network='impala' for smaller images")
        with torch.no_grad():
            probe = torch.zeros(1, *shape)
            n = self.conv(self._prepare(probe)).shape[-1]
        self.fc = nn.Sequential(_init(nn.Linear(n, 512), math.sqrt(2)), nn.ReLU())
        self.out_dim = 512

    def _prepare(self, x):
        x = x.float() / 255.0
        return x.permute(0, 3, 1, 2) if self.channels_last else x

    def forward(self, x):
        return self.fc(self.conv(self._prepare(x)))


class _Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaIntake(nn.Module):
    """IMPALA ResNet trunk (Espeholt et al., 2018) for uint8 images (HWC or CHW).

    Per stage a 3x3 conv, a 3x3 stride-2 max-pool and two residual blocks;
    stages of 16, 32 and 32 channels, then one 256-unit layer.
    """

    _prepare = ImageIntake._prepare

    def __init__(self, shape: tuple[int, ...], stages: tuple[int, ...] = (16, 32, 32), width: int = 256):
        super().__init__()
        self.channels_last = shape[-1] <= 4 < shape[0]
        c = shape[-1] if self.channels_last else shape[0]
        layers: list[nn.Module] = []
        for out in stages:
            layers += [nn.Conv2d(c, out, 3, padding=1), nn.MaxPool2d(3, 2, padding=1), _Residual(out), _Residual(out)]
            c = out
        self.conv = nn.Sequential(*layers, nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            n = self.conv(self._prepare(torch.zeros(1, *shape))).shape[-1]
        self.fc = nn.Sequential(_init(nn.Linear(n, width), math.sqrt(2)), nn.ReLU())
        self.out_dim = width

    def forward(self, x):
        return self.fc(self.conv(self._prepare(x)))


IMAGE_INTAKES = {"nature": ImageIntake, "impala": ImpalaIntake}


class VectorIntake(nn.Module):
    """Flattens a Box observation (or one-hots a Discrete one) and runs a tanh MLP."""

    def __init__(self, space: gym.Space, hidden_sizes: tuple[int, ...]):
        super().__init__()
        self.one_hot = space.n if isinstance(space, gym.spaces.Discrete) else None
        self.first = int(space.start) if isinstance(space, gym.spaces.Discrete) else 0   # Discrete(n, start=s)
        in_dim = int(self.one_hot or np.prod(space.shape))
        layers: list[nn.Module] = []
        for width in hidden_sizes:
            layers += [_init(nn.Linear(in_dim, width), math.sqrt(2)), nn.Tanh()]
            in_dim = width
        self.mlp = nn.Sequential(*layers)
        self.out_dim = in_dim

    def forward(self, x):
        if self.one_hot is not None:
            x = F.one_hot(x.long() - self.first, int(self.one_hot))
        return self.mlp(x.float().flatten(1))


class ActorCritic(nn.Module):
    """Policy and value heads on intakes chosen from the observation space.

    Vector observations get separate policy and value MLPs (sharing hurts small
    control tasks); images share one CNN (`image_network`: `nature` or `impala`).
    `age` counts optimizer steps; every sample this network produces is stamped
    with it (a rollout's `policy_age`). With `normalize_observations` every input
    first goes through an `ObservationNormalizer`, whose statistics are part of the
    network's state (vector observations only).

    With `recurrent_size` H > 0 an LSTM core (learner/recurrent.py) sits between one shared trunk and the
    heads: `step` acts one step from a carried state, `replay` runs a stored sequence, and the flat calls
    (`forward`, `policy_params`, `value`) mean an episode's first step, from the empty state.
    """

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, hidden_sizes=(64, 64),
                 image_network: str = "nature", normalize_observations: bool = False, normalize_clip: float = 10.0,
                 recurrent_size: int = 0):
        super().__init__()
        self.recurrent_size = int(recurrent_size)
        self.obs_normalizer = None
        if normalize_observations:
            if not (isinstance(obs_space, gym.spaces.Box) and obs_space.dtype != np.uint8):
                raise ValueError(f"normalize_observations=True is invalid for observation space {obs_space}: "
                                 "expected a Box of floats (images and Discrete observations are not normalised)")
            self.obs_normalizer = ObservationNormalizer(tuple(obs_space.shape), normalize_clip)
        if isinstance(obs_space, gym.spaces.Box) and obs_space.dtype == np.uint8 and len(obs_space.shape) == 3:
            if image_network not in IMAGE_INTAKES:
                raise ValueError(f"image_network={image_network!r} is invalid: "
                                 f"expected one of {', '.join(IMAGE_INTAKES)}")
            self.policy_intake = IMAGE_INTAKES[image_network](tuple(obs_space.shape))
            self.value_intake = self.policy_intake
        else:
            self.policy_intake = VectorIntake(obs_space, tuple(hidden_sizes))
            self.value_intake = VectorIntake(obs_space, tuple(hidden_sizes))
        # A core per distinct trunk: an image trunk's one core serves both heads (as CleanRL's LSTM agent);
        # vector policy and value keep separate paths, memory included (as sb3-contrib's RecurrentPPO).
        shared = self.value_intake is self.policy_intake
        self.cores = nn.ModuleList(
            [RecurrentCore(intake.out_dim, self.recurrent_size)
             for intake in ((self.policy_intake,) if shared else (self.policy_intake, self.value_intake))]
            if self.recurrent_size else [])
        policy_in = self.recurrent_size or self.policy_intake.out_dim
        value_in = self.recurrent_size or self.value_intake.out_dim
        if isinstance(action_space, gym.spaces.Discrete):
            self.dist = Categorical(int(action_space.n))
            self.policy_out = _init(nn.Linear(policy_in, self.dist.num_params), 0.01)
            self.log_std = None
        else:
            self.dist = DiagGaussian(action_space)
            self.policy_out = _init(nn.Linear(policy_in, self.dist.dim), 0.01)
            self.log_std = nn.Parameter(torch.zeros(self.dist.dim))
        self.value_out = _init(nn.Linear(value_in, 1), 1.0)
        self.register_buffer("age_buffer", torch.zeros((), dtype=torch.int64))
        self.generator = torch.Generator()
        self.age = 0

    def normalized(self, obs: torch.Tensor) -> torch.Tensor:
        """What the intakes see: the observations, normalised where this network normalises them."""
        return obs if self.obs_normalizer is None else self.obs_normalizer(obs)

    def policy_params(self, obs: torch.Tensor) -> torch.Tensor:
        return self._policy_params(self.normalized(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self._value(self.normalized(obs))

    def forward(self, obs: torch.Tensor):
        return self.policy_params(obs), self.value(obs)

    def _policy_params(self, x: torch.Tensor) -> torch.Tensor:
        return self._policy_head(self._from_empty_state(self.policy_intake(x), 0))

    def _value(self, x: torch.Tensor) -> torch.Tensor:
        return self._value_head(self._from_empty_state(self.value_intake(x), len(self.cores) - 1))

    def _from_empty_state(self, features: torch.Tensor, core: int) -> torch.Tensor:
        """What a head sees for a flat batch: the trunk's features, or its core's first step of an episode."""
        if not self.cores:
            return features
        n = features.shape[0]
        starts = torch.ones(n, dtype=torch.bool, device=features.device)
        return self.cores[core].step(features, self.cores[core].initial_state(n, features.device), starts)[:, 0]

    def _policy_head(self, h: torch.Tensor) -> torch.Tensor:
        out = self.policy_out(h)
        if self.log_std is not None:
            out = torch.cat([out, self.log_std.expand_as(out)], -1)
        return out

    def _value_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.value_out(h).squeeze(-1)

    # ------------------------------------------------------------------ recurrent
    # The state of n envs is one tensor [n, 2 * cores, H]: (h, c) of the policy's core, then the value's.
    def initial_state(self, n: int, device=None) -> torch.Tensor:
        """The empty state of n envs (recurrent networks only)."""
        return torch.zeros((n, 2 * len(self.cores), self.recurrent_size), device=device)

    def _intakes(self) -> tuple[nn.Module, ...]:
        return (self.policy_intake,) if len(self.cores) == 1 else (self.policy_intake, self.value_intake)

    def step(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor):
        """One step of n envs from their carried state: (params, values, the state after the step)."""
        x = self.normalized(obs)
        state = torch.cat([core.step(intake(x), state[:, 2 * i: 2 * i + 2], starts)
                           for i, (core, intake) in enumerate(zip(self.cores, self._intakes(), strict=True))], 1)
        return self._policy_head(state[:, 0]), self._value_head(state[:, -2]), state

    def replay(self, obs: torch.Tensor, starts: torch.Tensor, state: torch.Tensor, final: bool = False):
        """A stored sequence obs [L, n, ...] from the state [n, 2 * cores, H] it began with, `starts` [L, n]
        marking episode starts: (params [L, n, P], values [L, n], with `final` the state after its last step,
        else None)."""
        length, n = starts.shape
        x = self.normalized(obs.reshape(length * n, *obs.shape[2:]))
        outputs, finals = [], []
        for i, (core, intake) in enumerate(zip(self.cores, self._intakes(), strict=True)):
            h, last = core.replay(intake(x).reshape(length, n, -1), starts, state[:, 2 * i: 2 * i + 2], final)
            outputs.append(h)
            finals.append(last)
        return (self._policy_head(outputs[0]), self._value_head(outputs[-1]),
                torch.cat(finals, 1) if final else None)

    @torch.no_grad()
    def act_recurrent(self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor):
        """Sample actions one step on: (actions, dist params, log-probs, the state after the step)."""
        params, _, state = self.step(obs, state, starts)
        actions, logp = self.dist.sample(params, self.generator)
        return actions, params, logp, state

    def heads(self) -> dict[str, list[nn.Parameter]]:
        """Each output head's own parameters (intakes may be shared), for per-head gradient statistics."""
        policy = list(self.policy_out.parameters()) + ([self.log_std] if self.log_std is not None else [])
        return {"policy": policy, "value": list(self.value_out.parameters())}

    @torch.no_grad()
    def weights_checksum(self) -> float:
        """A fingerprint of the parameters and floating-point buffers (an observation normaliser's statistics):
        sums of values and of squares in float64. The same weights give the same number on any process, other
        weights another. Per rollout, not per step."""
        return sum(float64_sums([*self.parameters(), *(b for b in self.buffers() if b.is_floating_point())]))

    def value_bias(self) -> nn.Parameter:
        """The parameter added to every value (the value head's bias): its gradient is sum_i dL/dV_i."""
        return self.value_out.bias

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(int(seed))

    @torch.no_grad()
    def act(self, obs: torch.Tensor):
        """Sample actions for a batch of observations: (actions, dist params, log-probs)."""
        params = self.policy_params(obs)
        actions, logp = self.dist.sample(params, self.generator)
        return actions, params, logp

    # The age lives in a plain int for speed on the hot path and in a buffer so it
    # travels with state_dict() into checkpoints and Ray weight broadcasts.
    def state_dict(self, *args, **kwargs):
        self.age_buffer.fill_(self.age)
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self.age = int(self.age_buffer)
        return result
