"""Whether emitted observations belong to the env's declared observation space, counted cheaply (the witness's)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


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
