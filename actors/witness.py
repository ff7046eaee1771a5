"""A witness of raw env output, below the runner, and the boundary statistics computed from it.

`Witness` wraps the gymnasium vector env the runner steps. It records, in its
own copies and independently of the runner's storing code, what each env was
stepped with and what it returned: the action, the reward, the terminated and
truncated flags, whether the step was a NEXT_STEP reset, the number of steps,
a few observations at random (t, env) positions, and whether each emitted
observation belongs to the declared observation space. `take()` hands the
record of one rollout (a `WitnessRecord`, a few kB) to the runner, which puts
it on the rollout; it travels with it (pickled through Ray in Ray mode), and
`boundary_statistics` compares it with the rollout wherever the rollout is
learned from.

Statistics (row keys; 0 when the invariant holds, larger when broken, NaN
when the update had nothing to compare: no episode end for the episode-end
statistic, no reset step for the reset statistic; absent when the rollout
carries no witness record):

inv_boundary_actions
    Fraction of witnessed (t, env) positions whose stored action, mapped the
    way the runner maps it for the env (clipped to the Box bounds for
    continuous actions), differs from the action the env received.
    Derivation: the runner stores the action it sampled and steps the env
    with that action (clipped); both are the same float32 or integer values,
    so equality is exact. The witness copies the action as the step returns
    (cheaper than before it; the runner cannot act during the step). False
    alarms: none (exact comparison), unless an env writes into the action
    array it is given.

inv_boundary_rewards
    Largest relative difference |stored - env| / max(|env|, 1e-30) over all
    positions, the env's reward first rounded to float32 as storing rounds
    it (equal non-finite values count as equal, unequal ones as 1).
    Derivation: the stored reward is the env's reward rounded to float32;
    rounding the witnessed one the same way makes the comparison exact, so a
    correct run reads 0. False alarms: none (a difference of even one float32
    ulp, 6e-8 relative, is a changed reward; the limit of 1e-6 ignores those).

inv_boundary_episode_ends
    Number of terminated plus truncated flags that differ from the env's.
    Derivation: the flags are copied. False alarms: none (exact).

inv_boundary_observations
    Largest relative difference between the rollout's obs[t, env] and the
    observation the env emitted before step t (obs[T]: after the last step)
    at 4 random positions per rollout, the emitted one rounded to the
    rollout's dtype. Derivation: the runner stores the emitted observation
    cast to float32 (pixels stay uint8); rounded the same way they are equal,
    so a correct run reads 0. False alarms: none (exact). Detection: a fault that
    changes a fraction f of positions is seen with probability
    1 - (1 - f)^4 per rollout; observations stored a step off or transformed
    (f near 1) are seen on the first rollout.

inv_boundary_resets
    Number of steps that follow a done (terminated or truncated, as the env
    returned them) of the same env, i.e. NEXT_STEP reset transitions, that
    the rollout marks valid. The witness carries the done of each env's last
    step into the next rollout. Derivation: in NEXT_STEP autoreset the step
    after a done only resets the env; its reward and action have no meaning.
    False alarms: none (exact).

inv_boundary_step_count
    |env steps the witness saw - the rollout's steps (T x envs)| + |agent
    steps the witness saw (steps that are not resets) - the rollout's
    env_steps (its valid count, what the run's step accounting adds up)|.
    Derivation: both count the same steps. False alarms: none (exact).

inv_observation_space
    Fraction of emitted observations (one per env per step) that are not in
    the env's declared observation space: another dtype (kind for Discrete)
    or shape, a value outside the Box bounds (NaN is outside, as in
    gymnasium's `contains`), or outside a Discrete's range. Checked on the
    raw output, before the runner casts it. Derivation: a correct env's
    observations are members of its observation space. False alarms: envs
    whose declared bounds are conventions rather than guarantees; the limit
    (1% for 5 updates in a row) tolerates rare excursions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import gymnasium as gym
import numpy as np

OBS_SAMPLES = 4
"""Observations copied per rollout, at random (t, env) positions."""
TINY = 1e-30


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
        self._space = SpaceCheck(env.single_observation_space, self.n)
        self._prev_done = np.zeros(self.n, dtype=bool)
        self._last_obs = None
        self._emits = -1   # the first output (the reset's) is checked
        self._origin = int.from_bytes(os.urandom(8), "little") >> 1
        self._seq = 0
        self._fresh = False
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
        self._last_obs = obs   # _emit, inlined
        self._emits += 1
        if not self._emits % SPACE_CHECK_EVERY:
            self._check_space(obs)
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
            action_low=self._low, action_high=self._high, complete=complete, origin=self._origin, seq=self._seq,
            fresh=self._fresh)
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


class SpaceCheck:
    """Counts the rows of batches of `n` observations that are not in a Box or Discrete space.

    `hold` checks a batch's dtype and shape at once and keeps a copy of it; the bounds of the kept batches are
    compared together (`totals`, or when HELD batches are waiting), one vectorised comparison for many."""

    HELD = 16

    def __init__(self, space: gym.Space, n: int):
        self.space, self.n = space, n
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self.shape = (n,) if self.discrete else (n, *space.shape)
        if self.discrete:
            self.low, self.high = int(space.start), int(space.start + space.n - 1)
            self.bounded = True
        else:
            self.low, self.high = np.asarray(space.low), np.asarray(space.high)
            # Integer pixels bounded by their dtype's own range cannot leave it: skip the comparison.
            full = (np.issubdtype(space.dtype, np.integer) and (self.low == np.iinfo(space.dtype).min).all()
                    and (self.high == np.iinfo(space.dtype).max).all())
            self.bounded = not full
        self._held: np.ndarray | None = None
        self._fits: np.dtype | None = None
        """The dtype of the last batch that fitted the space (the next of the same dtype needs no test)."""
        self.restart()

    def restart(self) -> None:
        """Count from 0 (batches held and not yet compared are dropped)."""
        self.outside = self.emitted = self._waiting = 0

    def hold(self, obs) -> None:
        """Take one batch of observations (one per env) into the count."""
        arr = np.asarray(obs)
        self.emitted += self.n
        if arr.dtype is not self._fits or arr.shape != self.shape:   # the common case in two checks
            if arr.shape != self.shape or not self._dtype_fits(arr.dtype):
                self.outside += self.n
                return
            self._fits = arr.dtype
            if self._held is None or self._held.dtype != arr.dtype:
                self._compare()   # batches of the former dtype first
                self._held = np.empty((self.HELD, *self.shape), dtype=arr.dtype)
        if self.bounded:
            self._held[self._waiting] = arr
            self._waiting += 1
            if self._waiting == self.HELD:
                self._compare()

    def totals(self) -> tuple[int, int]:
        """(observations outside the space, observations checked) since `restart`."""
        self._compare()
        return self.outside, self.emitted

    def _dtype_fits(self, dtype: np.dtype) -> bool:
        return np.issubdtype(dtype, np.integer) if self.discrete else dtype == self.space.dtype

    def _compare(self) -> None:
        if not self._waiting:
            return
        held = self._held[:self._waiting]
        self._waiting = 0
        if (held >= self.low).all() and (held <= self.high).all():
            return   # the common case in two comparisons; rows are counted only when some value is outside
        inside = (held >= self.low) & (held <= self.high)   # NaN compares False: outside, as in Box.contains
        self.outside += int(held.shape[0] * self.n - inside.reshape(held.shape[0] * self.n, -1).all(1).sum())


# ----------------------------------------------------------------- the comparison
STATISTICS = ("inv_boundary_actions", "inv_boundary_rewards", "inv_boundary_episode_ends", "inv_boundary_observations",
              "inv_observations_transformed", "inv_boundary_resets", "inv_boundary_step_count",
              "inv_observation_space")


def relative_difference(stored: np.ndarray, witnessed: np.ndarray) -> np.ndarray:
    """|stored - witnessed| / max(|witnessed|, 1e-30), elementwise, with the witnessed value first rounded to
    the stored dtype (what storing does to it); equal values (NaN, inf included) give 0, unequal non-finite 1."""
    stored = np.asarray(stored)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.asarray(witnessed).astype(stored.dtype)
    s, w = stored.astype(np.float64), rounded.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(s - w) / np.maximum(np.abs(w), TINY)
    same = (s == w) | (np.isnan(s) & np.isnan(w))
    return np.where(same, 0.0, np.where(np.isfinite(diff), diff, 1.0))


def _max(values: np.ndarray) -> float:
    return float(values.max()) if values.size else 0.0


def boundary_statistics(rollout) -> dict[str, float]:
    """The boundary statistics (module docstring) of a rollout against its witness records; {} if it has none.

    Positions are compared over the steps both have (a rollout with a step missing or added is the
    step count's to report, not every later position's)."""
    records = [r for r in getattr(rollout, "witness", ()) or () if r.complete]
    if not records:
        return {}
    T = rollout.num_steps
    acts = rollout.actions.numpy()
    rewards = rollout.rewards.numpy()
    term, trunc, valid = rollout.terminated.numpy(), rollout.truncated.numpy(), rollout.valid.numpy()
    obs = rollout.obs.numpy()
    reward_diff = 0.0
    positions = action_diff = ends = resets = steps = agent_steps = 0
    obs_diff = obs_transformed = 0.0
    end_events = reset_events = obs_compared = 0
    outside = emitted = 0
    for rec in records:
        envs = slice(rec.env_offset, rec.env_offset + rec.num_envs)
        t = min(T, rec.rewards.shape[0])
        stored = acts[:t, envs]
        if rec.action_low is not None:
            stored = np.clip(stored, rec.action_low, rec.action_high)
        witnessed = rec.actions[:t]
        differ = relative_difference(stored, witnessed) > 0   # exact: any difference at all
        action_diff += int(differ.reshape(t, rec.num_envs, -1).any(-1).sum())
        positions += t * rec.num_envs
        reward_diff = max(reward_diff, _max(relative_difference(rewards[:t, envs], rec.rewards[:t])))
        env_term, env_trunc, env_resets = rec.terminated[:t], rec.truncated[:t], rec.resets[:t]
        ends += int((term[:t, envs] != env_term).sum() + (trunc[:t, envs] != env_trunc).sum())
        end_events += int((term[:t, envs] | trunc[:t, envs] | env_term | env_trunc).sum())
        resets += int((valid[:t, envs] & env_resets).sum())
        reset_events += int(env_resets.sum())
        steps += rec.steps
        agent_steps += rec.agent_steps
        for (ts, e), seen in zip(rec.obs_at.tolist(), rec.obs, strict=True):
            if ts <= T:
                obs_compared += 1
                column = rec.env_offset + e
                gap = _max(relative_difference(obs[ts, column], seen))
                # The env's observation stored in a neighbouring slot is a pairing fault (the actor's); one that
                # is stored nowhere near, changed, is a transform between env and learner (preprocessing).
                paired_elsewhere = gap > 0 and any(
                    _max(relative_difference(obs[other, column], seen)) == 0
                    for other in (ts - 1, ts + 1) if 0 <= other <= T)
                if paired_elsewhere or gap == 0:
                    obs_diff = max(obs_diff, gap)
                else:
                    obs_transformed = max(obs_transformed, gap)
        outside += rec.outside_space
        emitted += rec.emitted
    covered = sum(rec.num_envs for rec in records)
    # A batch with an unwitnessed part (a runner without a witness) is compared on its witnessed envs only.
    claimed = rollout.env_steps if covered == rollout.num_envs else sum(
        int(valid[:, rec.env_offset:rec.env_offset + rec.num_envs].sum()) for rec in records)
    step_count = abs(steps - T * covered) + abs(agent_steps - claimed)
    nan = float("nan")
    # Where there was nothing to compare (no episode ended, no reset step) the update measured nothing: NaN,
    # so that a fault seen only at episode ends is judged on the updates that hold some, in a row.
    return {
        "inv_boundary_actions": action_diff / positions if positions else nan,
        "inv_boundary_rewards": float(reward_diff) if positions else nan,
        "inv_boundary_episode_ends": float(ends) if end_events else nan,
        "inv_boundary_observations": float(obs_diff) if obs_compared else nan,
        "inv_observations_transformed": float(obs_transformed) if obs_compared else nan,
        "inv_boundary_resets": float(resets) if reset_events else nan,
        "inv_boundary_step_count": float(step_count),
        "inv_observation_space": outside / emitted if emitted else float("nan"),
    }
