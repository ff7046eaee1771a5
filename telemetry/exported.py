"""inv_exported_as_computed: what a scrape reads of the learner's gauges, re-derived from the values the run computed.

An update's statistics reach Prometheus through two parts: the recorder (each catalogued gauge takes the stats
key its `source` names, per label value) and the scrape-time collector (series -> metric families). Right after
the recorder took an update's statistics, each learner gauge fed from a stats key is read back through the
collector, as a scrape reads it, and compared with the finite stats value it was set from. In a correct process
the two are the same float: set, stored and read back. A gauge fed from another key, scaled or converted on the
way, filed under another label value, or missing from what a scrape returns reads as a difference, while every
row and verdict of the run (made from the stats, not the scrape) stays right: the dashboards and alerts are
what would be wrong.

Statistic: the share of the compared series whose exported value differs from the computed one (exact), judged
on the next update; NaN where nothing was compared (verbosity off: nothing is exported). Measured on the
learner's sampled updates (`learner.invariants.is_sampled`): a read of every family the process exports.
"""

from __future__ import annotations

import math

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
    return differ / compared if compared else math.nan


class ExportCheck:
    """The statistic of the latest sampled update, handed to the next update's judging."""

    def __init__(self):
        self.pending: float | None = None

    def after_record(self, stats: dict, exported: dict[str, dict[tuple, float]] | None) -> None:
        self.pending = export_gap(stats, exported)

    def take_statistic(self) -> dict[str, float]:
        pending, self.pending = self.pending, None
        return {} if pending is None else {"inv_exported_as_computed": pending}
