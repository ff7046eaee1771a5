"""Independent env streams: no two envs of a run replay the same episodes.

Every env a run steps (a column of a runner's vector env; in Ray mode, per
actor incarnation) must draw its own episodes: envs seeded alike (every actor
given the run's seed, a vector env whose sub-envs share one seed, a restarted
actor replaying its first life) feed the learner the same data several times,
and nothing else in the run looks wrong: it just learns slower.

inv_streams_independent (per update, once two or more streams are judgeable)
    The number of pairs of env streams whose first `RESETS` reset
    observations (the observation a NEXT_STEP reset transition leads to, as
    the env emitted it) are identical, counted only when chance cannot explain
    them. Chance: the probability that two reset observations of independent
    draws coincide is estimated from pairs *within* each stream (its `RESETS`
    resets, 15 pairs), an upper bound p = (equal pairs + 3) / pairs, which
    duplicated streams do not inflate; two independent streams then share all
    `RESETS` with probability p ** RESETS, and the run's pairs of streams
    S(S-1)/2 times that must stay below `CHANCE`. Envs whose start state is
    fixed (probes, deterministic resets) or has few values never reach that
    bound and are not judged.
    Derivation: reset observations come from the env's random generator, so
    differently seeded envs start different episodes; CartPole's 4 uniforms,
    Pendulum's angle and speed, Acrobot's joints coincide with probability 0
    in float32. Envs whose steps also draw from the generator (LunarLander's
    engine dispersion) keep identical resets only where the actions are
    identical too (actors seeded alike in everything). False alarms: at most
    CHANCE per run by construction.

Cost: one hash per episode end, none per step.
"""

from __future__ import annotations

import math

import numpy as np

RESETS = 6
"""Reset observations per stream that make its signature."""
CHANCE = 1e-6
"""Largest expected number of chance coincidences among all pairs of streams at which duplicates are judged."""


class StreamIndependence:
    """The learner's record of each env stream's first reset observations, and the duplicates among them."""

    def __init__(self):
        self.resets: dict[tuple, list[int]] = {}
        """stream -> hashes of its first RESETS reset observations."""
        self.signatures: dict[tuple[int, ...], list[tuple]] = {}
        self.equal_pairs = self.pairs = 0

    def observe(self, rollout) -> dict[str, float]:
        """The statistic after this batch: NaN while fewer than two streams have their signature."""
        valid = rollout.valid.numpy() if hasattr(rollout.valid, "numpy") else np.asarray(rollout.valid)
        resets_t, resets_n = np.nonzero(~valid)
        if resets_t.size:
            obs = rollout.obs.numpy() if hasattr(rollout.obs, "numpy") else np.asarray(rollout.obs)
            streams = self._streams(rollout)
            for t, n in zip(resets_t.tolist(), resets_n.tolist(), strict=True):
                self._add(streams[n], hash(obs[t + 1, n].tobytes()))
        return {"inv_streams_independent": self.statistic()}

    def _streams(self, rollout) -> list[tuple]:
        """Each column's stream: (actor, incarnation's pid, column in its runner)."""
        columns = int(rollout.valid.shape[1])
        owners = [(int(c["actor"]), int(c["pid"])) for c in getattr(rollout, "actor_counters", ())]
        per = columns // len(owners) if owners and columns % len(owners) == 0 else None
        if per is None:
            owners, per = [(int(getattr(rollout, "actor_id", 0)), 0)], columns
        return [(*owners[min(n // per, len(owners) - 1)], n % per) for n in range(columns)]

    def _add(self, stream: tuple, digest: int) -> None:
        seen = self.resets.setdefault(stream, [])
        if len(seen) >= RESETS:
            return
        self.equal_pairs += sum(d == digest for d in seen)
        self.pairs += len(seen)
        seen.append(digest)
        if len(seen) == RESETS:
            self.signatures.setdefault(tuple(seen), []).append(stream)

    def statistic(self) -> float:
        complete = sum(len(s) for s in self.signatures.values())
        if complete < 2 or not self.pairs:
            return math.nan
        p = min(1.0, (self.equal_pairs + 3) / self.pairs)
        if complete * (complete - 1) / 2 * p ** RESETS > CHANCE:
            return 0.0                                  # duplicates could be chance: not judged
        return float(sum(len(s) * (len(s) - 1) // 2 for s in self.signatures.values()))

    def duplicates(self) -> list[list[tuple]]:
        """The groups of streams that replay each other, by (actor, pid, column)."""
        return [streams for streams in self.signatures.values() if len(streams) > 1]
