"""Probe environments: tiny envs whose correct values and action probabilities are known exactly.

Each probe exercises a chosen set of the pieces of RL and is immune to the
others by construction, so the *pattern* of passes and failures over all of
them names the broken component (`rlvitals doctor`, docs/doctor.md):

- a constant observation (always 0) makes a probe immune to bugs in what the
  learner is shown: observation preprocessing (0 is a fixed point of scaling and
  of mean/std normalisation) and observations paired with the wrong step;
- one step per episode makes it immune to discounting and truncation bugs:
  every target is the reward itself, a supervised target (unless something
  leaks across the episode's end);
- no episode boundary at all (P9) makes it immune to every bug in handling
  episode ends: termination, truncation, resets, cutting the recursion;
- a probe whose observation is drawn afresh every step, terminal observation
  included, breaks when each action is paired with the next step's observation;
  one that holds its observation for the whole episode does not, but it still
  breaks when the learner sees observations transformed differently.

`PROBES` lists them; docs/doctor.md says what each one is immune to.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium import spaces

REFERENCE_GAMMA = 0.9
"""The doctor's reference discount; the (1 - gamma)-reward probes use it under their plain ids."""
TIME_LIMIT = 8
"""Steps after which the time-limit probe is truncated."""


class _Probe(gym.Env):
    """Shared plumbing: one float observation in [-1, 1], a reward rule, a fixed episode length."""

    metadata = {"render_modes": []}
    num_actions = 1
    episode_length: int | None = 1
    """Steps until the episode terminates; None: it never terminates (a time limit truncates it)."""

    def __init__(self):
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(self.num_actions)
        self._t = 0
        self._obs = 0.0

    def _observe(self) -> np.ndarray:
        return np.array([self._obs], dtype=np.float32)

    def _random_sign(self) -> float:
        return float(self.np_random.choice([-1.0, 1.0]))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._obs = self._first_obs()
        return self._observe(), {}

    def step(self, action):
        reward = float(self._reward(int(action)))
        self._t += 1
        terminated = self.episode_length is not None and self._t >= self.episode_length
        self._obs = self._terminal_obs() if terminated else self._next_obs()
        return self._observe(), reward, terminated, False, {}

    def _reward(self, action: int) -> float:
        raise NotImplementedError

    def _first_obs(self) -> float:
        return 0.0

    def _next_obs(self) -> float:
        return self._obs

    def _terminal_obs(self) -> float:
        """The observation returned with termination: never acted on, never bootstrapped from."""
        return self._obs


class ConstantValueProbe(_Probe):
    """1: one action, zero observation, one step, reward +1. V = 1: a supervised target."""

    def _reward(self, action):
        return 1.0


class DiscountProbe(_Probe):
    """2: one action, two steps, reward +1 at the end. V(first) = gamma, V(second) = 1.

    The observation is 0 on the first step and 1 on the second: with the same
    observation on both steps no value network could tell them apart.
    """

    episode_length = 2

    def _reward(self, action):
        return 1.0 if self._t == 1 else 0.0

    def _next_obs(self):
        return 1.0


class ObservationRewardProbe(_Probe):
    """3: one action, random +1/-1 observation drawn afresh every step, one step, reward = observation.

    V(o) = o. The terminal observation is a fresh draw too, so a learner that
    pairs each reward with the next step's observation sees no relation at all.
    """

    def _first_obs(self):
        return self._random_sign()

    def _reward(self, action):
        return self._obs

    def _terminal_obs(self):
        return self._random_sign()


class ActionRewardProbe(_Probe):
    """4: two actions, zero observation, one step, reward +1 for action 1, -1 for action 0. pi(1) = 1, V = 1."""

    num_actions = 2

    def _reward(self, action):
        return 1.0 if action == 1 else -1.0


class ObservationActionProbe(_Probe):
    """5: two actions, random +1/-1 observation drawn afresh every step, one step, reward +1 when the
    action matches the sign (action 1 for +1, action 0 for -1), else -1. pi(correct|o) = 1, V(o) = 1."""

    num_actions = 2

    def _first_obs(self):
        return self._random_sign()

    def _reward(self, action):
        return 1.0 if (action == 1) == (self._obs > 0) else -1.0

    def _terminal_obs(self):
        return self._random_sign()


class HeldObservationProbe(ObservationRewardProbe):
    """6: probe 3 with the observation held for the whole episode, terminal observation included.

    V(o) = o. Pairing an action with the next step's observation changes nothing
    here, so this probe passes when only the pairing is wrong, and fails like
    probe 3 when the learner sees observations transformed differently.
    """

    def _terminal_obs(self):
        return self._obs


class TimeLimitProbe(_Probe):
    """7: one action, zero observation, reward (1 - gamma) every step, never terminates, truncated by a
    time limit. V = (1 - gamma) / (1 - gamma) = 1 at every step: a time limit must bootstrap.

    Treating the truncation as a termination gives V = 1 - gamma^k with k steps
    left (about 0.36 on average for gamma 0.9 and 8 steps); ignoring gamma makes
    V grow without bound.
    """

    episode_length = None

    def __init__(self, gamma: float = REFERENCE_GAMMA):
        super().__init__()
        self.gamma = float(gamma)

    def _reward(self, action):
        return 1.0 - self.gamma


class EndlessProbe(TimeLimitProbe):
    """9: probe 7 without the time limit: one action, zero observation, reward (1 - gamma) every step, no
    episode ever ends. V = 1, learned by bootstrapping alone.

    With no episode boundary anywhere, nothing that handles boundaries
    (termination masks, truncation, resets, the recursion's cut at episode
    ends) can break it: only discounting, the value loss and the optimizer can.
    """


class IndifferentActionProbe(_Probe):
    """8: two actions, zero observation, one step, reward +1 or -1 at random whatever the action.

    Nothing should make one action more likely than the other: an entropy bonus
    keeps pi uniform, and without one the advantages carry only noise. An entropy
    bonus with its sign flipped drives pi to a single action.
    """

    num_actions = 2

    def _reward(self, action):
        return self._random_sign()


@dataclass(frozen=True)
class ProbeSpec:
    env_id: str
    cls: type
    implicates: str
    """What a failure of this probe alone (all the others passing) points at."""
    observations: tuple[float, ...]
    """Observations to evaluate the learned network on."""
    values: tuple[float | None, ...]
    """Expected V(o) per observation; `None` means gamma (filled in by the checker); empty: no value check."""
    best_actions: tuple[int | None, ...]
    """Action whose probability should approach 1 per observation (None: single-action probe)."""
    rewards: tuple[tuple[float, ...], ...] = ()
    """Reward of each action at each observation (action probes): V(o) is then sum_a pi(a|o) r(o, a), the
    value of the policy actually learned, which an entropy bonus keeps short of the best action's reward."""
    uniform_policy: bool = False
    """The policy must stay (near) uniform: no action is better than another."""
    reward_check: bool = False
    """Every reward is non-zero: a value of 0 means no reward reached the learner with its step."""
    max_episode_steps: int | None = None
    """Time limit the env is registered with (truncation), if any."""
    summary: str = ""
    """The probe in one line."""

    @property
    def name(self) -> str:
        """P1, P2, ...: the short name the doctor's pattern uses."""
        return "P" + self.env_id.split("Probe", 1)[1].split("-", 1)[0]


PROBES: tuple[ProbeSpec, ...] = (
    ProbeSpec("rlvitals/Probe1-v0", ConstantValueProbe, "value loss or optimizer",
              (0.0,), (1.0,), (None,), reward_check=True,
              summary="one action, obs 0, one step, reward +1: V = 1"),
    ProbeSpec("rlvitals/Probe2-v0", DiscountProbe, "reward discounting",
              (0.0, 1.0), (None, 1.0), (None, None),
              summary="one action, two steps, reward +1 at the end: V = gamma, 1"),
    ProbeSpec("rlvitals/Probe3-v0", ObservationRewardProbe, "pairing of observations with their step",
              (-1.0, 1.0), (-1.0, 1.0), (None, None),
              summary="one action, fresh random obs every step, reward = obs: V(o) = o"),
    ProbeSpec("rlvitals/Probe4-v0", ActionRewardProbe, "advantage calculation, policy loss or policy update",
              (0.0,), (1.0,), (1,), rewards=((-1.0, 1.0),),
              summary="two actions, obs 0, reward +1/-1 by action: pi(1) = 1"),
    ProbeSpec("rlvitals/Probe5-v0", ObservationActionProbe, "observations, actions and rewards paired wrongly",
              (-1.0, 1.0), (1.0, 1.0), (0, 1), rewards=((1.0, -1.0), (-1.0, 1.0)),
              summary="two actions, fresh random obs, +1 if the action matches it"),
    ProbeSpec("rlvitals/Probe6-v0", HeldObservationProbe, "observations seen differently by learner and actors",
              (-1.0, 1.0), (-1.0, 1.0), (None, None),
              summary="P3 with the obs held for the episode: V(o) = o"),
    ProbeSpec("rlvitals/Probe7-v0", TimeLimitProbe, "bootstrapping at a time limit (truncation handling)",
              (0.0,), (1.0,), (None,), max_episode_steps=TIME_LIMIT,
              summary="one action, obs 0, reward 1-gamma, time limit 8: V = 1"),
    ProbeSpec("rlvitals/Probe8-v0", IndifferentActionProbe, "the entropy bonus, or a spurious policy gradient",
              (0.0,), (), (None,), uniform_policy=True,
              summary="two actions, obs 0, reward +1/-1 at random: pi uniform"),
    ProbeSpec("rlvitals/Probe9-v0", EndlessProbe, "discounting or the optimizer (no episode boundary to get wrong)",
              (0.0,), (1.0,), (None,),
              summary="one action, obs 0, reward 1-gamma, never ends: V = 1"),
)
GAMMA_PROBES = {PROBES[6].env_id: TimeLimitProbe, PROBES[8].env_id: EndlessProbe}
"""Probes whose per-step reward is (1 - gamma), so that V = 1 whatever the discount."""


def gamma_env_id(env_id: str, gamma: float) -> str:
    """Id of a (1 - gamma)-reward probe registered for `gamma` (registered on first use)."""
    gamma = float(gamma)
    if gamma == REFERENCE_GAMMA:
        return env_id
    base = env_id.split("/", 1)[1].split("-v", 1)[0]
    variant = f"rlvitals/{base}g{gamma:.9g}-v0"
    if variant not in gym.registry:
        spec = gym.spec(env_id)
        gym.register(variant, entry_point=GAMMA_PROBES[env_id], kwargs={"gamma": gamma},
                     max_episode_steps=spec.max_episode_steps, disable_env_checker=True)
    return variant


def time_limit_env_id(gamma: float) -> str:
    """Id of the time-limit probe (P7) whose per-step reward makes V = 1 under `gamma`."""
    return gamma_env_id(PROBES[6].env_id, gamma)


def register_probes() -> None:
    for probe in PROBES:
        if probe.env_id not in gym.registry:
            gym.register(probe.env_id, entry_point=probe.cls, max_episode_steps=probe.max_episode_steps,
                         disable_env_checker=True)


register_probes()
