"""A witness of raw env output, directly on the env gymnasium built, below the runner.

`Witness` wraps the gymnasium vector env as gymnasium's make_vec (or the Atari builder) returned it
(actors/envs.py), below anything rlvitals adds on top. It records, in its
own copies and independently of the runner's storing code, what each env was
stepped with and what it returned: the action, the reward, the terminated and
truncated flags, whether the step was a NEXT_STEP reset, the number of steps,
a few observations at random (t, env) positions, and whether each emitted
observation belongs to the declared observation space; in a sync vector env, probes around each sub-env's
TimeLimit also judge its truncations against its contract (actors/time_limit.py), and sampled episodes of
its sub-envs are replayed on fresh instances to judge whether their resets restore their state
(actors/reset_replay.py). `take()` hands the
record of one rollout (a `WitnessRecord`, a few kB) to the runner, which puts
it on the rollout; it travels with it (pickled through Ray in Ray mode), and
`boundary_statistics` (actors/boundary.py) compares it with the rollout wherever the
rollout is learned from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import gymnasium as gym
import numpy as np

from .reset_replay import ResetReplay
from .space_check import SpaceCheck
from .time_limit import probe_time_limits, take_decisions

OBS_SAMPLES = 4
"""Observations copied per rollout, at random (t, env) positions."""


@dataclass
class WitnessRecord:
    """What the envs of one runner received and returned during one rollout (the witness's own copies)."""

    actions: np.ndarray
    """[T, n, ...] actions the env was stepped with (when pickled, integers in the narrowest dtype that holds
    them exactly)."""
    rewards: np.ndarray
    """[T, n] rewards as the env returned them, float64 ones rounded to float32: the rollout stores float32,
    and the comparison rounds to the stored dtype anyway."""
    terminated: np.ndarray
    """[T, n] bool, as the env returned them."""
    truncated: np.ndarray
    """[T, n] bool, as the env returned them."""
    done_before: np.ndarray
    """[n] bool: each env's step before this rollout ended an episode (its first step here is a reset)."""
    steps: int
    """Env steps taken (vector steps x envs)."""
    obs_at: np.ndarray
    """[K, 2] (t, env) of the observations kept, in the rollout's indexing (obs[t]: before step t)."""
    obs: np.ndarray
    """[K, *obs_shape] those observations, as emitted."""
    outside_space: int
    """Emitted observations (one per env) not in the declared observation space."""
    emitted: int
    """Emitted observations checked."""
    action_low: np.ndarray | None = None
    action_high: np.ndarray | None = None
    """Bounds the runner clips continuous actions to before stepping (None: discrete)."""
    action_start: int = 0
    """A Discrete space's first action: the env received the stored index plus it."""
    env_offset: int = 0
    """Where this runner's envs start in the rollout (several actors' rollouts side by side)."""
    complete: bool = True
    """False when some env output could not be recorded (the runner reports such output itself)."""
    origin: int = 0
    """The witness that recorded it (random per witness: a runner, an actor incarnation)."""
    seq: int = 0
    """Its records in order (0, 1, ...): consecutive ones continue each other's episodes."""
    fresh: bool = False
    """The first record after the envs were reset: every episode in it began at its start."""
    limit_decisions: int = 0
    """Time-limit decisions of the sub-envs' TimeLimit wrappers judged in this rollout (actors/time_limit.py)."""
    limit_wrong: int = 0
    """Of them, those against the TimeLimit's contract."""
    steps_total: int = -1
    """Env steps the witness counted since it was built, this record's included (-1: not counted); every step
    is in some record, so the records that reach the learner add up to it (rlvitals/evidence.py)."""
    reset_replays: int = 0
    """Episodes of the sub-envs replayed on a fresh instance and judged in this rollout (actors/reset_replay.py)."""
    reset_replays_differ: int = 0
    """Of them, those whose transitions differ from the run's: state carried across the env's reset."""

    @property
    def resets(self) -> np.ndarray:
        """[T, n] bool: the step followed a done of the same env (a NEXT_STEP reset)."""
        done = self.terminated | self.truncated
        return np.concatenate([self.done_before[None], done[:-1]]) if len(done) else done

    @property
    def agent_steps(self) -> int:
        """Of the env steps, the ones that are not resets."""
        return int(self.resets.size - np.count_nonzero(self.resets))

    @property
    def num_envs(self) -> int:
        return int(self.rewards.shape[1]) if self.rewards.ndim == 2 else 0

    def shifted(self, offset: int) -> WitnessRecord:
        return replace(self, env_offset=self.env_offset + offset)

    def __getstate__(self) -> dict:
        # Compacted where it is shipped (Ray pickles each rollout), not on the actor's every collection.
        return {**self.__dict__, "actions": _compact(self.actions)}


SPACE_CHECK_EVERY = 8
"""Outputs between two checks of the observations against the declared space."""


class Column:
    """One recorded quantity, a row per step, copied into a buffer allocated once per rollout.

    Without a `fixed` dtype the first row fixes the buffer's dtype, and a later row of another dtype promotes
    the buffer (nothing is rounded to the first row's dtype); with one (the episode-end flags: bool) every row
    is cast to it, as `np.array(row, dtype=fixed)` would. The first row fixes the shape: a row of another
    shape raises ValueError (ragged output: the record is incomplete), unless numpy broadcasts it to the row
    (a scalar), which is what the runner stores too. The buffer grows when more steps come than announced."""

    __slots__ = ("buf", "dtype", "shape", "fixed")

    def __init__(self, steps: int, fixed: np.dtype | None = None, shape: tuple | None = None):
        self.fixed, self.dtype, self.shape = fixed, None, None
        self.buf = steps   # the steps announced, until the first row (or now, when dtype and shape are known)
        if fixed is not None and shape is not None:
            self.buf, self.dtype, self.shape = np.empty((steps, *shape), fixed), np.dtype(fixed), shape

    def put(self, t: int, row) -> None:
        try:   # the common case: one identity check and one copy, no allocation
            if row.dtype is self.dtype or self.fixed is not None:
                self.buf[t] = row
                return
        except (AttributeError, IndexError, TypeError, ValueError):   # no buffer yet, not an array, past the
            pass                                                     # buffer's end, another shape
        self._put_slowly(t, row)

    def _put_slowly(self, t: int, row) -> None:
        row = np.asarray(row, dtype=self.fixed)
        if self.shape is None:   # the first row
            self.buf = np.empty((max(self.buf, t + 1), *row.shape), dtype=row.dtype)
            self.shape = row.shape
        elif row.shape != self.shape:
            raise ValueError(f"a row of shape {row.shape} after rows of shape {self.shape}")
        dtype = np.result_type(self.buf.dtype, row.dtype)
        if t >= len(self.buf) or dtype != self.buf.dtype:
            grown = np.empty((max(len(self.buf), 2 * t + 1), *self.shape), dtype=dtype)
            grown[:t] = self.buf[:t]
            self.buf = grown
        self.buf[t] = row
        self.dtype = self.buf.dtype   # rows of the buffer's own dtype take the fast path

    def rows(self, t: int, empty_shape: tuple) -> np.ndarray:
        """The first t rows (a view: the buffer is this rollout's alone), or an empty array when none came."""
        return self.buf[:t] if self.shape is not None else np.zeros(empty_shape)


class Witness(gym.vector.VectorWrapper):
    """Records what a vector env received and returned, for the rollout between `begin` and `take`."""

    def __init__(self, env: gym.vector.VectorEnv, seed: int = 0, obs_samples: int = OBS_SAMPLES):
        super().__init__(env)
        self.n = env.num_envs
        self.obs_samples = obs_samples
        self._rng = np.random.default_rng([int(seed), 0x5EED])  # its own stream: the run's draws are untouched
        space = env.single_action_space
        self._low = np.asarray(space.low) if isinstance(space, gym.spaces.Box) else None
        self._high = np.asarray(space.high) if isinstance(space, gym.spaces.Box) else None
        self._action_start = int(space.start) if isinstance(space, gym.spaces.Discrete) else 0
        self._space = SpaceCheck(env.single_observation_space, self.n)
        self._limits = probe_time_limits(env)   # None: no sub-env with gymnasium's TimeLimit
        self._replay = ResetReplay.attach(env)  # None: no sub-envs to replay (a vector entry point, ALE's own)
        self._prev_done = np.zeros(self.n, dtype=bool)
        self._last_obs = None
        self._emits = -1   # the first output (the reset's) is checked
        self._origin = int.from_bytes(os.urandom(8), "little") >> 1
        self._seq = 0
        self._fresh = False
        self._steps_total = 0
        self._clear(0)

    def _clear(self, num_steps: int) -> None:
        self._t = 0
        self._actions, self._rewards = Column(num_steps), Column(num_steps)
        self._terms, self._truncs = Column(num_steps, bool, (self.n,)), Column(num_steps, bool, (self.n,))
        self._done_before = self._prev_done
        self._space.restart()
        self._complete = True
        self._want: dict[int, list[int]] = {}
        """t -> envs whose observation obs[t] is to be kept."""
        self._kept: list[tuple[int, int, np.ndarray]] = []
        if num_steps > 0 and self.obs_samples > 0:
            ts = self._rng.integers(0, num_steps + 1, self.obs_samples)
            es = self._rng.integers(0, self.n, self.obs_samples)
            for t, e in zip(ts.tolist(), es.tolist(), strict=True):
                self._want.setdefault(t, []).append(e)

    def _keep(self, t: int, obs) -> None:
        for e in self._want.get(t, ()):
            self._kept.append((t, e, np.array(obs[e], copy=True)))

    def _emit(self, obs) -> None:
        self._last_obs = obs
        self._emits += 1
        if not self._emits % SPACE_CHECK_EVERY:   # a share of outputs: every 8th measures it at 1/8 of the cost
            self._check_space(obs)

    def _check_space(self, obs) -> None:
        try:
            self._space.hold(obs)
        except Exception:   # unusable output: the runner reports it; the record says it is incomplete
            self._complete = False

    # ------------------------------------------------------------- the vector env's interface
    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._seq += 1          # episodes in progress end here unreported: the next record continues none
        self._fresh = True
        self._prev_done = np.zeros(self.n, dtype=bool)
        if self._replay is not None:
            self._replay.restart()
        self._emit(obs)
        return obs, info

    def step(self, actions):
        t = self._t
        obs, reward, terminated, truncated, info = self.env.step(actions)
        # The action is copied as the env returns, next to its outputs: then numpy's copy runs warm, right after
        # the env's own numpy code, and costs about 4 us less per CartPole step than one made before the step,
        # straight out of the policy's torch code. A runner's fault cannot happen during the step, so none
        # is missed; an env that writes into its input array would read as a changed action.
        acts = self._actions
        try:
            if actions.dtype is not acts.dtype:
                raise TypeError
            acts.buf[t] = actions
        except Exception:
            self._put(acts, t, actions)
        rewards, terms, truncs = self._rewards, self._terms, self._truncs
        try:   # the flags' columns cast to bool, as reading them does: only the rewards' dtype needs a look
            if reward.dtype is not rewards.dtype:
                raise TypeError
            rewards.buf[t] = reward
            terms.buf[t] = terminated
            truncs.buf[t] = truncated
        except Exception:   # the first step, a new dtype or shape, more steps than announced, not arrays
            for column, row in ((rewards, reward), (terms, terminated), (truncs, truncated)):
                self._put(column, t, row)
        if t + 1 in self._want:
            try:
                self._keep(t + 1, obs)
            except Exception:
                self._complete = False
        self._t = t + 1
        self._steps_total += self.n   # every step, inside or outside a rollout: the lowest level's own count
        self._last_obs = obs   # _emit, inlined
        self._emits += 1
        if not self._emits % SPACE_CHECK_EVERY:
            self._check_space(obs)
        if self._replay is not None:
            try:
                self._replay.after_step(actions, obs, terminated, truncated, reward)
            except Exception:   # unusable output: the runner reports it; its episodes are not replayed
                self._replay = None
        return obs, reward, terminated, truncated, info

    def _put(self, column: Column, t: int, row) -> None:
        try:
            column.put(t, row)
        except Exception:   # unusable output: the runner reports it; the record says it is incomplete
            self._complete = False

    # ------------------------------------------------------------- rollouts
    def begin(self, num_steps: int) -> None:
        """A rollout of `num_steps` steps starts: pick the observations to keep, keep obs[0]."""
        self._clear(num_steps)
        if self._last_obs is not None:
            self._keep(0, self._last_obs)

    def take(self) -> WitnessRecord:
        """The record of the steps since `begin` (its arrays are this rollout's buffers, handed over, not copied)."""
        n, t = self.n, self._t
        complete = self._complete
        try:
            outside, emitted = self._space.totals()
        except Exception:
            complete, outside, emitted = False, 0, 0
        try:
            terminated, truncated = (np.asarray(c.rows(t, (0, n)), bool) for c in (self._terms, self._truncs))
            rewards = _compact(self._rewards.rows(t, (0, n)))
            actions = self._actions.rows(t, (0, n))
            if rewards.dtype.kind not in "biuf" or actions.dtype.kind not in "biuf" or (
                    terminated.shape != rewards.shape or truncated.shape != rewards.shape):
                raise TypeError("not numbers")
        except (ValueError, TypeError):  # non-numeric output: nothing comparable was recorded
            complete, rewards, actions = False, np.zeros((0, n)), np.zeros((0, n))
            terminated = truncated = np.zeros((0, n), bool)
        kept = self._kept
        obs = np.stack([o for _, _, o in kept]) if kept and len({o.shape for _, _, o in kept}) == 1 else None
        record = WitnessRecord(
            actions=actions, rewards=rewards, terminated=terminated, truncated=truncated,
            done_before=self._done_before, steps=t * n,
            obs_at=np.array([(t, e) for t, e, _ in kept] if obs is not None else [], dtype=np.int64).reshape(-1, 2),
            obs=obs if obs is not None else np.zeros(0), outside_space=outside, emitted=emitted,
            action_low=self._low, action_high=self._high, action_start=self._action_start,
            complete=complete, origin=self._origin, seq=self._seq,
            fresh=self._fresh)
        record.limit_decisions, record.limit_wrong = take_decisions(self._limits)
        record.steps_total = self._steps_total
        if self._replay is not None:
            record.reset_replays, record.reset_replays_differ = self._replay.judge()
        self._seq, self._fresh = self._seq + 1, False
        if len(terminated):   # a fresh array, never changed in place: the next record's done_before
            self._prev_done = terminated[-1] | truncated[-1]
        self._clear(0)
        return record


def _compact(values: np.ndarray) -> np.ndarray:
    """The same values in fewer bytes where that loses nothing the comparison uses: integers in the narrowest
    dtype that holds them, float64 as float32 (what the rollout stores, and what the comparison rounds to)."""
    if values.dtype.kind in "iu" and values.size:
        narrow = values.astype(np.result_type(np.min_scalar_type(values.min()), np.min_scalar_type(values.max())))
        return narrow if np.array_equal(narrow, values) else values
    if values.dtype == np.float64:
        with np.errstate(over="ignore"):
            return values.astype(np.float32)
    return values
