"""Each Ray actor against its peers, from the counters on its rollouts: the run's own verdict can name an actor
that is far slower than the rest, or silent while they deliver.

Prometheus's fleet rules (telemetry/fleet_rules.py) find the actor that slowed
down among thousands from its scraped series. A run's verdicts.json is judged
on its rows, which hold run-level values; so the driver does the same
comparison on what it already receives and puts the few outliers on the row:
`actors_slow` (how many) and `actors_slow_named` (which: actor index, pid,
speed against the median), which RLActorSlowerThanPeers reads and quotes.

An actor's speed is env steps per second of stepping and inference (its own
`ActorCounters` phases) over its last few rollouts: waiting for work or for
weights is the learner's and the weight sync's, not the actor's. The bound is
the fleet rules' own: slower than both half the median and SIGMAS robust
standard deviations (interquartile range / 1.349) below it, judged once there
are MIN_PEERS actors with a speed. An incarnation that delivered nothing
recently (it died and was restarted) is left out.

A *silent* actor delivers nothing while its peers go on: its newest
incarnation's latest rollout is more than SILENT_FACTOR of its usual gaps
behind (gaps counted in arrivals of anyone's rollouts, its usual gap being the
larger of its own recent median and the number of actors, the gap of an
actor as fast as the fleet's typical one). A slow actor keeps its own
rhythm, and a slow fleet slows every gap alike, so neither is silent; one that
hangs (an env step that never returns, a lost request) falls further behind
with every arrival of its peers'. Counted in arrivals, never seconds, so a
slower machine names it after the same rollouts. `actors_silent` and
`actors_silent_named` (actor, pid, rollouts since its last) go on the row;
RLActorSilentAmongPeers reads them, the run's twin of the live RLActorStalled.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from rlvitals.telemetry.attribution import actor_name
from rlvitals.telemetry.fleet_rules import SIGMAS, SLOW_FRACTION

WINDOW = 4
"""Rollouts per incarnation its speed is measured over."""
MIN_PEERS = 4
"""Actors with a speed before any is judged against the others."""
RECENT = 4
"""An incarnation counts while its latest rollout is among the last RECENT x (incarnations) to arrive."""
NAMED = 5
"""How many slow (silent) actors the row names, the worst first; `actors_slow` (`actors_silent`) counts them all."""
SILENT_FACTOR = 8
"""An actor is silent once it is this many of its usual gaps behind."""


def slow_below(speeds: list[float]) -> float | None:
    """The speed an actor must fall under to be slow among `speeds` (None: too few to judge)."""
    if len(speeds) < MIN_PEERS:
        return None
    q25, median, q75 = np.quantile(np.asarray(speeds, dtype=np.float64), (0.25, 0.5, 0.75))
    spread = (q75 - q25) / 1.349
    return float(min(SLOW_FRACTION * median, median - SIGMAS * spread))


class PeerSpeeds:
    """Per actor incarnation, its recent speed; per update, which incarnations are far slower than the rest."""

    def __init__(self):
        self.recent: dict[tuple[int, int], deque] = {}
        self.last_seen: dict[tuple[int, int], int] = {}
        self.gaps: dict[tuple[int, int], deque] = {}
        """Per incarnation, the arrivals between its last rollouts (its rhythm)."""
        self.newest: dict[int, tuple[int, int]] = {}
        """Actor index -> its newest incarnation (the latest to deliver a first rollout)."""
        self.arrivals = 0

    def arrived(self, key: tuple[int, int], counters: dict) -> None:
        """A rollout's counters from incarnation `key` = (actor, pid)."""
        seconds = counters.get("seconds", {})
        active = seconds.get("env_step", 0.0) + seconds.get("inference", 0.0)
        self.recent.setdefault(key, deque(maxlen=WINDOW + 1)).append((float(counters.get("samples", 0)), active))
        self.arrivals += 1
        if key in self.last_seen:
            self.gaps.setdefault(key, deque(maxlen=WINDOW)).append(self.arrivals - self.last_seen[key])
        else:
            self.newest[key[0]] = key
        self.last_seen[key] = self.arrivals

    def silent(self) -> list[tuple[int, tuple[int, int]]]:
        """(rollouts of others since its last, incarnation) of each silent actor, the longest silence first."""
        live = len(self.newest)
        if live < MIN_PEERS:
            return []
        out = []
        for key in self.newest.values():
            gaps = self.gaps.get(key)
            if not gaps:
                continue    # one rollout: no rhythm yet
            usual = max(float(np.median(gaps)), live)
            behind = self.arrivals - self.last_seen[key]
            if behind > SILENT_FACTOR * usual:
                out.append((behind, key))
        return sorted(out, reverse=True)

    def speeds(self) -> dict[tuple[int, int], float]:
        """Env steps per active second of each incarnation that delivered recently and has two rollouts."""
        horizon = self.arrivals - RECENT * max(1, len(self.recent))
        out = {}
        for key, window in self.recent.items():
            if self.last_seen[key] <= horizon or len(window) < 2:
                continue
            (s0, a0), (s1, a1) = window[0], window[-1]
            if a1 > a0 and s1 > s0:
                out[key] = (s1 - s0) / (a1 - a0)
        return out

    def take_statistic(self) -> dict:
        """`actors_slow`, `actors_silent` and, when any, which (`actors_slow_named`, `actors_silent_named`);
        0 while too few actors can be judged."""
        silent = self.silent()
        out: dict = {"actors_slow": 0.0, "actors_silent": float(len(silent))}
        if silent:
            out["actors_silent_named"] = "; ".join(
                f"{actor_name(actor, pid)}: nothing in the {behind} rollouts its peers delivered since its last"
                for behind, (actor, pid) in silent[:NAMED])
        speeds = self.speeds()
        bound = slow_below(list(speeds.values()))
        if bound is None:
            return out
        slow = sorted((s, key) for key, s in speeds.items() if s < bound)
        out["actors_slow"] = float(len(slow))
        if slow:
            median = float(np.median(list(speeds.values())))
            out["actors_slow_named"] = "; ".join(
                f"{actor_name(actor, pid)}: {s:.4g} env steps/s against the median {median:.4g}"
                for s, (actor, pid) in slow[:NAMED])
        return out
