"""inv_exported_as_computed: what a scrape reads of the run's gauges, re-derived from the values the run computed.

An update's statistics reach Prometheus through two parts: the recorder (each catalogued gauge takes the stats
key its `source` names, per label value) and the scrape-time collector (series -> metric families). Right after
the recorder took an update's statistics, each learner gauge fed from a stats key is read back through the
collector, as a scrape reads it, and compared with the finite stats value it was set from. In a correct process
the two are the same float: set, stored and read back. A gauge fed from another key, scaled or converted on the
way, filed under another label value, or missing from what a scrape returns reads as a difference, while every
row and verdict of the run (made from the stats, not the scrape) stays right: the dashboards and alerts are
what would be wrong.

The actor's gauges are held the same way in the process that records its rollouts (the run's own in local mode,
each Ray actor's in its process, which carries its finding on the rollout): right after a rollout was recorded,
its network-age gauge against the age stamped on the rollout, and the episode return and length gauges against
the min, max, mean and std of the last EPISODE_WINDOW finished episodes with a finite return, a window kept here
apart from the recorder's. Counters are held by what was added to them (CounterLedger): between two reads, each
label-free learner counter rises by the sum of the update statistics it was given, and the actor's env-step and
episode counters by the rollouts' env steps and finished episodes.

Statistic: the largest share, learner's or actor's, of the compared series whose exported value differs from
the computed one (exact), judged on the next update; NaN where nothing was compared (verbosity off: nothing is
exported). Measured on the learner's sampled updates (`learner.invariants.is_sampled`): a read of every family
the process exports.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from .catalogue import METRICS
from .recorder import label_sets

LEARNER_GAUGES = tuple((m.name, label_sets(m, m.source)) for m in METRICS
                       if m.component == "learner" and m.kind == "gauge" and m.source)
"""(metric name, [(label values, stats key)]) of every learner gauge the recorder sets from an update's stats."""


def export_gap(stats: dict, exported: dict[str, dict[tuple, float]] | None) -> float:
    """The share of learner gauge series whose exported value is not the stats value they were set from.

    `exported`: metric name -> {label values: value} as a scrape reads them, for every family the process
    exports (an enabled family with no series is an empty dict); None: nothing is exported."""
    if exported is None:
        return math.nan
    compared, differ = gauge_differences(stats, exported)
    return differ / compared if compared else math.nan


def gauge_differences(stats: dict, exported: dict[str, dict[tuple, float]]) -> tuple[int, int]:
    """(learner gauge series compared, series that differ)."""
    compared = differ = 0
    for name, pairs in LEARNER_GAUGES:
        series = exported.get(name)
        if series is None:   # not exported at this verbosity
            continue
        for labels, key in pairs:
            value = stats.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue   # NaN leaves a gauge at its last value; nothing to compare
            compared += 1
            differ += series.get(labels) != float(value)
    return compared, differ


LEARNER_COUNTERS = tuple((m.name, m.source) for m in METRICS
                         if m.component == "learner" and m.kind == "counter" and m.source and not m.labels)
"""(metric name, stats key) of every label-free learner counter the recorder adds an update's statistic to."""
ACTOR_COUNTERS = ("rlvitals_actor_env_steps_total", "rlvitals_actor_episodes_total")


class CounterLedger:
    """Counters a scrape reads against what the run added to them: between two reads, each counter rises by the sum
    of the amounts computed for it in between (the first read only sets the base; a resumed run's counters go on
    from their saved values, which the base absorbs). The amounts are whole counts: compared exactly."""

    def __init__(self, names):
        self.names = tuple(names)
        self.added = dict.fromkeys(self.names, 0.0)
        self.base: dict[str, float] | None = None

    def add(self, name: str, amount: float) -> None:
        self.added[name] += amount

    def read(self, exported: dict[str, dict[tuple, float]]) -> tuple[int, int]:
        """(series compared, series that differ) since the previous read; the current values become the base."""
        now = {n: exported[n].get(()) for n in self.names if n in exported}
        compared = differ = 0
        for name, value in now.items() if self.base is not None else ():
            before = self.base.get(name)
            if before is not None or value is not None:
                compared += 1
                differ += value is None or before is None or value - before != self.added[name]
        self.base, self.added = now, dict.fromkeys(self.names, 0.0)
        return compared, differ


EPISODE_WINDOW = 100
"""The episode gauges' window, as the catalogue documents them: the last 100 finished episodes."""
EPISODE_GAUGES = ("rlvitals_actor_episode_return", "rlvitals_actor_episode_length")
NETWORK_AGE = "rlvitals_actor_network_age"


class ActorWindow:
    """The actor gauges' reference: the last EPISODE_WINDOW finished episodes with a finite return, kept apart."""

    def __init__(self):
        self.returns: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self.lengths: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self.counters = CounterLedger(ACTOR_COUNTERS)

    def add(self, rollout) -> None:
        episodes = rollout.episodes
        finite = np.isfinite(episodes.returns)   # an episode with a NaN reward has no return to show
        self.returns.extend(episodes.returns[finite].tolist())
        self.lengths.extend(episodes.lengths[finite].tolist())
        steps, ended = ACTOR_COUNTERS
        self.counters.add(steps, float(rollout.env_steps))
        self.counters.add(ended, float(len(episodes.returns)))

    def observe(self, rollout, exported: dict[str, dict[tuple, float]] | None) -> float | None:
        """Every rollout the process recorded, taken into the window; the gap where a scrape was read now
        (`exported`; None: not read this time)."""
        self.add(rollout)
        return None if exported is None else self.gap(rollout, exported)

    def gap(self, rollout, exported: dict[str, dict[tuple, float]]) -> float:
        """The share of the actor's exported gauge and counter series that differ from the reference (NaN: none
        exported)."""
        expected: dict[str, dict[tuple, float]] = {NETWORK_AGE: {(): float(rollout.policy_age)}}
        for name, window in zip(EPISODE_GAUGES, (self.returns, self.lengths), strict=True):
            if window:
                arr = np.asarray(window, dtype=np.float64)
                expected[name] = {("min",): arr.min(), ("max",): arr.max(), ("mean",): arr.mean(),
                                  ("std",): arr.std()}
        compared, differ = self.counters.read(exported)
        for name, series in expected.items():
            if name not in exported:   # not exported at this verbosity
                continue
            for labels, value in series.items():
                compared += 1
                differ += exported[name].get(labels) != float(value)
        return differ / compared if compared else math.nan


class ExportCheck:
    """The statistic of the latest sampled update, handed to the next update's judging."""

    def __init__(self):
        self.pending: float | None = None
        self.actor_pending: float | None = None
        self.window = ActorWindow()
        self.counters = CounterLedger(name for name, _ in LEARNER_COUNTERS)

    def count(self, stats: dict) -> None:
        """Every update the recorder took: the amounts its learner counters were given."""
        for name, key in LEARNER_COUNTERS:
            if key in stats:
                self.counters.add(name, stats[key])

    def after_record(self, stats: dict, exported: dict[str, dict[tuple, float]] | None) -> None:
        if exported is None:
            self.pending = math.nan
            return
        gauges, gauges_differ = gauge_differences(stats, exported)
        counters, counters_differ = self.counters.read(exported)
        compared = gauges + counters
        self.pending = (gauges_differ + counters_differ) / compared if compared else math.nan

    def after_rollout(self, rollout, exported: dict[str, dict[tuple, float]] | None) -> None:
        """Every rollout this process recorded; `exported`: what a scrape reads now (None: not read this time)."""
        gap = self.window.observe(rollout, exported)
        if gap is not None:
            self.actor_pending = gap

    def from_actors(self, rollout) -> None:
        """Ray mode: the actors' own checks of their exported gauges, carried on the batch's rollouts."""
        gaps = [g for g in getattr(rollout, "export_gaps", ()) if not math.isnan(g)]
        if gaps:
            self.actor_pending = max(gaps)

    def take_statistic(self) -> dict[str, float]:
        measured = [x for x in (self.pending, self.actor_pending) if x is not None and not math.isnan(x)]
        taken = self.pending is not None or self.actor_pending is not None
        self.pending = self.actor_pending = None
        if not taken:
            return {}
        return {"inv_exported_as_computed": max(measured) if measured else math.nan}
