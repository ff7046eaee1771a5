"""The episodes a rollout reports (returns, lengths: what a user watches) against the witness's raw env output.

inv_episode_statistics (per update; NaN when no episode could be recomputed
and the counts agree)
    The runner reports each episode that ended during a rollout (its return:
    the sum of the rewards of its agent steps; its length: their number), in
    the order the episodes ended (time-major, then env). `EpisodeWitness`
    recomputes them from the witness's records alone: per env, the rewards of
    live steps summed and counted since the episode's NEXT_STEP reset, carried
    from a witness's record to its next one (`origin`, `seq`); an episode in
    progress when a record is missing (a rollout dropped as stale, a restart)
    is not recomputed. The statistic is the largest of: 1 if the number of
    episodes reported differs from the number of episode ends the env returned;
    1 for a recomputed episode whose length differs; its |reported return -
    witnessed return| / (sum of |reward| over the episode + 1e-12).
    Derivation: both sides add the same float32 rewards in float64, in order or
    as differences of running sums, so they agree to about 1e-15 of the
    episode's sum of |reward| (the limit, 1e-6, leaves a factor of 1e9); lengths
    and counts are exact. False alarms: none. Cost: a few vectorised operations
    per rollout in the learner; none in the actors.
    Judged only on inputs that are right: the runner sums the rewards it was
    handed, so where the rollout's stored rewards differ from the witness's
    (an upstream stage changed them: boundary_rewards names it) the reports
    have no trusted reference and the update reads NaN.
"""

from __future__ import annotations

import math

import numpy as np

from .boundary import relative_difference

TINY = 1e-12


class EpisodeWitness:
    """Per witness (its `origin`), the episodes in progress at the end of its latest record."""

    def __init__(self):
        self.carry: dict[int, tuple[int, np.ndarray]] = {}
        """origin -> (seq of the record it follows, [3, n] return, length and sum of |reward| so far; NaN where
        unknown)."""

    def observe(self, rollout) -> dict[str, float]:
        records = [r for r in getattr(rollout, "witness", ()) or () if r.complete]
        if not records or sum(r.num_envs for r in records) != rollout.num_envs:
            return {}            # a part unwitnessed: its episodes sit between the witnessed ones in the list
        returns = np.asarray(rollout.episodes.returns, dtype=np.float64)
        lengths = np.asarray(rollout.episodes.lengths)
        offset, worst, compared = 0, 0.0, 0
        for rec in sorted(records, key=lambda r: r.env_offset):
            count, positions, witnessed = self._episodes(rec, rollout.num_steps)
            if offset + count > returns.size:
                return {"inv_episode_statistics": 1.0}
            mine, offset = positions + offset, offset + count
            if not positions.size:
                continue
            compared += positions.size
            if (lengths[mine] != witnessed[1]).any():
                return {"inv_episode_statistics": 1.0}
            got, want = returns[mine], witnessed[0]
            same = (got == want) | (np.isnan(got) & np.isnan(want))
            with np.errstate(invalid="ignore", over="ignore"):
                gap = np.abs(got - want) / (np.abs(witnessed[2]) + TINY)
            worst = max(worst, float(np.where(same, 0.0, np.where(np.isfinite(gap), gap, 1.0)).max()))
        if offset != returns.size:
            return {"inv_episode_statistics": 1.0}
        if not compared or not _rewards_as_witnessed(rollout, records):
            return {"inv_episode_statistics": math.nan}
        return {"inv_episode_statistics": worst}

    def _episodes(self, rec, T: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(episode ends in the record, the indices among them of the ones recomputed, [3, k] their return,
        length and sum of |reward|); updates the witness's carry."""
        rewards = rec.rewards[:T].astype(np.float64)
        resets = rec.resets[:T]
        live = ~resets
        n = rewards.shape[1]
        seq, before = self.carry.get(rec.origin, (None, None))
        if rec.fresh:
            before = np.zeros((3, n))          # the envs were reset at the record's start
        elif before is None or seq != rec.seq - 1 or before.shape[1] != n:
            before = np.full((3, n), np.nan)
        if not rewards.shape[0]:
            self.carry[rec.origin] = (rec.seq, before)
            return 0, np.zeros(0, np.int64), np.zeros((3, 0))
        steps = np.arange(rewards.shape[0])[:, None]
        started = np.maximum.accumulate(np.where(resets, steps, -1), axis=0)   # the latest reset step so far
        kept = np.where(live, rewards, 0.0)
        with np.errstate(invalid="ignore", over="ignore"):
            running = np.stack([np.cumsum(kept, 0), np.cumsum(live, 0), np.cumsum(np.abs(kept), 0)])   # [3, T, n]
        ends = (rec.terminated[:T] | rec.truncated[:T]) & live
        t_end, n_end = np.nonzero(ends)                                       # time-major, then env: the runner's
        start = started[t_end, n_end]
        with np.errstate(invalid="ignore", over="ignore"):
            since_reset = running[:, t_end, n_end] - running[:, np.maximum(start, 0), n_end]
            episodes = np.where(start >= 0, since_reset, before[:, n_end] + running[:, t_end, n_end])
            last = started[-1]
            tail = running[:, -1] - running[:, np.maximum(last, 0), np.arange(n)]
            after = np.where(last >= 0, tail, before + running[:, -1])
        self.carry[rec.origin] = (rec.seq, after)
        known = ~np.isnan(episodes[0]) | (start >= 0)
        return int(t_end.size), np.nonzero(known)[0], episodes[:, known]


def _rewards_as_witnessed(rollout, records) -> bool:
    """Whether the rollout stores the rewards its witness records saw (rounded as storing rounds them)."""
    stored = rollout.rewards.numpy()
    for rec in records:
        t = min(rollout.num_steps, rec.rewards.shape[0])
        if relative_difference(stored[:t, rec.env_offset:rec.env_offset + rec.num_envs], rec.rewards[:t]).any():
            return False
    return True
