"""The unit of experience that travels from an actor to the learner."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class EpisodeStats:
    """Episodes that ended during one rollout (one entry per episode)."""

    returns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    successes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    """1/0 per episode where the env reports success (`is_success`/`success` in info), else empty."""


@dataclass
class Rollout:
    """`rollout_length` steps of `num_envs` environments, time-major.

    Autoreset is gymnasium's NEXT_STEP mode: after an env reports done, its
    next step only resets it. That reset transition is kept (so `obs` stays a
    plain [T+1] sequence and obs[t+1] is the *true* final observation of a
    truncated episode, the one to bootstrap from) but marked `valid=False`,
    and every loss and statistic ignores it.
    """

    obs: torch.Tensor
    """[T+1, N, *obs_shape] observations; obs[t+1] follows obs[t]."""
    actions: torch.Tensor
    """[T, N] (discrete) or [T, N, A] (continuous) actions taken."""
    rewards: torch.Tensor
    """[T, N] float32 rewards received after each action."""
    terminated: torch.Tensor
    """[T, N] bool: the episode ended in a terminal state (no bootstrap)."""
    truncated: torch.Tensor
    """[T, N] bool: the episode was cut off by a time limit (bootstrap from obs[t+1])."""
    valid: torch.Tensor
    """[T, N] bool: False for the reset transitions of NEXT_STEP autoreset."""
    behaviour_params: torch.Tensor
    """[T, N, P] distribution parameters of the behaviour policy (logits, or mean and log-std)."""
    behaviour_logp: torch.Tensor
    """[T, N] log-probability of the taken action under the behaviour policy."""
    policy_age: int
    """Age (learner steps) of the network that acted; staleness = learner age - policy_age."""
    actor_id: int = 0
    episodes: EpisodeStats = field(default_factory=EpisodeStats)
    timings: dict = field(default_factory=dict)
    """Seconds this rollout spent in env.step, in inference, and waiting for weights."""
    weights_checksums: tuple = ()
    """Fingerprint of the network that acted, one per actor in the batch (empty: a policy without weights)."""

    @property
    def num_steps(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1])

    @property
    def env_steps(self) -> int:
        """Agent steps in this rollout (reset transitions excluded)."""
        return int(self.valid_count)

    valid_count: int = 0
    """Number of valid transitions, computed once by the runner."""
    discounted_returns: torch.Tensor | None = None
    """[T, N] each env's running discounted return after each step, reset at episode ends (reward scaling
    only: the runner keeps it, since only it sees every step of its envs in order; None otherwise)."""
    actor_counters: tuple = ()
    """Ray mode: each producing actor's own counters (rollouts produced, delivered, dropped; seconds by phase)
    as it delivered this rollout, one dict per actor in the batch (rlvitals.distributed.accounting)."""
    initial_state: torch.Tensor | None = None
    """[N, 2, H] a recurrent policy's state of each env when the rollout began, before any reset at its first
    step (None: a feed-forward policy)."""
    initial_starts: torch.Tensor | None = None
    """[N] bool: obs[0] begins an episode, so the state is zeroed before the first step (recurrent only). Later
    starts follow from `valid`: the step after a reset transition begins an episode."""
    sequence: int = -1
    """The producing runner's count of rollouts before this one (-1: unknown, or parts of differing counts)."""
    state_age: int = -1
    """Age of the network that computed `initial_state` (the previous rollout's; -1: the empty initial state)."""
    witness: tuple = ()
    """What the envs received and returned, recorded below the runner (actors.witness.WitnessRecord, one per
    runner whose envs are in the batch; empty: not witnessed)."""
    acting_gaps: tuple = ()
    """Each producing runner's check that it acted with its own network on what it stored
    (actors/acting_check.py; NaN where not checked)."""
    export_gaps: tuple = ()
    """Ray mode: each producing actor's check of its own exported gauges right after it recorded this rollout
    (telemetry.exported.ActorWindow.gap), on the rollouts it checks (empty: none checked)."""

    def __post_init__(self):
        # A pipeline with bounded queues holds a bounded number of rollouts; counting the live
        # ones lets the health rules see batches being retained long before memory shows it.
        _LIVE.add(1)
        weakref.finalize(self, _LIVE.add, -1)

    def __getstate__(self) -> dict:
        # Shipped as numpy arrays: pickle protocol 5 hands those to Ray out of band (no copy into the pickle,
        # zero-copy reads from the object store), where torch tensors are pickled in band: a 58 MB Pong
        # rollout took 0.75 s each way as tensors, 0.05 s and 0.0001 s as arrays (loaded 2-core machine).
        state = dict(self.__dict__)
        state["_numpy_fields"] = tuple(k for k, v in state.items() if isinstance(v, torch.Tensor))
        for k in state["_numpy_fields"]:
            state[k] = state[k].numpy()
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        for k in state.pop("_numpy_fields", ()):
            arr = state[k]
            # Read-only arrays (views into Ray's shared object store) are copied: the learner owns its batch.
            state[k] = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        # Unpickling (a rollout arriving from a Ray actor) skips __post_init__: count it here too,
        # or the learner process of Ray mode would see none of the rollouts it holds.
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def bytes_per_sample(self) -> float:
        """Bytes of this rollout's tensors per valid sample: what a process keeping every sample it sees gains
        per sample (the memory invariant's unit)."""
        tensors = [v for v in self.__dict__.values() if isinstance(v, torch.Tensor)]
        return sum(t.element_size() * t.nelement() for t in tensors) / max(self.valid_count, 1)

    @staticmethod
    def alive() -> int:
        """Rollouts of this process not yet garbage-collected."""
        return _LIVE.value

    @classmethod
    def concat(cls, rollouts: list[Rollout]) -> Rollout:
        """Rollouts of the same length side by side, as one batch of all their envs (in the order given).

        The batch's `policy_age` is the oldest of its parts, so staleness is never understated;
        per-rollout timings do not add up meaningfully and are dropped.
        """
        if len(rollouts) == 1:
            return rollouts[0]
        lengths = {r.num_steps for r in rollouts}
        if len(lengths) != 1:
            raise ValueError(f"rollouts of different lengths {sorted(lengths)} cannot be put side by side")

        def cat(name: str) -> torch.Tensor:
            return torch.cat([getattr(r, name) for r in rollouts], dim=1)

        eps = [r.episodes for r in rollouts]
        return cls(
            obs=cat("obs"), actions=cat("actions"), rewards=cat("rewards"), terminated=cat("terminated"),
            truncated=cat("truncated"), valid=cat("valid"), behaviour_params=cat("behaviour_params"),
            behaviour_logp=cat("behaviour_logp"), policy_age=min(r.policy_age for r in rollouts),
            episodes=EpisodeStats(np.concatenate([e.returns for e in eps]), np.concatenate([e.lengths for e in eps]),
                                  np.concatenate([e.successes for e in eps])),
            timings={}, valid_count=sum(r.valid_count for r in rollouts),
            weights_checksums=tuple(c for r in rollouts for c in r.weights_checksums),
            discounted_returns=cat("discounted_returns") if rollouts[0].discounted_returns is not None else None,
            witness=_side_by_side_witness(rollouts),
            initial_state=_envs_side_by_side(rollouts, "initial_state"),
            initial_starts=_envs_side_by_side(rollouts, "initial_starts"),
            state_age=min(r.state_age for r in rollouts),
            sequence=rollouts[0].sequence if len({r.sequence for r in rollouts}) == 1 else -1,
            actor_counters=tuple(c for r in rollouts for c in r.actor_counters),
            export_gaps=tuple(g for r in rollouts for g in r.export_gaps),
            acting_gaps=tuple(g for r in rollouts for g in r.acting_gaps))


def _envs_side_by_side(rollouts: list[Rollout], name: str) -> torch.Tensor | None:
    """A per-env field ([N, ...]) of the parts, concatenated in the batch's env order; None where they have none."""
    parts = [getattr(r, name) for r in rollouts]
    return None if parts[0] is None else torch.cat(parts, dim=0)


def _side_by_side_witness(rollouts: list[Rollout]) -> tuple:
    """The parts' witness records, each moved to where its envs are in the batch."""
    out, offset = [], 0
    for r in rollouts:
        out.extend(w.shifted(offset) for w in r.witness)
        offset += r.num_envs
    return tuple(out)


class _Tally:
    def __init__(self):
        self.value = 0
        self._lock = threading.Lock()  # finalizers run in whichever thread collects

    def add(self, amount: int) -> None:
        with self._lock:
            self.value += amount


_LIVE = _Tally()
