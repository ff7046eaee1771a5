"""Metric state written by the training loop and read by the scrape-time collector.

The loop calls `record_*` once per rollout or batch with host values it
already has; each call is a few dict writes under a lock. Prometheus objects
are only built when someone scrapes, in the HTTP server's thread.

A metric name that is not in the catalogue, or a label value outside a
metric's declared set, is a bug in the caller (a typo would otherwise export
nothing, silently). Under pytest, or with RLVITALS_STRICT_METRICS=1, it
raises UnknownMetricError; in production runs it is logged once per name
and dropped, so a week-long run does not die over a metric it cannot
export. A catalogued metric that is merely not exported at this level or
by this component is dropped without a word: that is what levels are for.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from itertools import product

import numpy as np

from .catalogue import BY_NAME, METRICS, Metric
from .rules import HELD_METRIC

log = logging.getLogger("rlvitals.telemetry")

ACTOR_PHASES = BY_NAME["rlvitals_actor_phase_seconds_total"].label_values["phase"]
"""The phases a rollout's timings are exported under (a phase a rollout lacks adds 0: local mode's)."""

COMPONENTS = {
    "local": {"run", "learner", "actor", "queue", "process", "node", "gpu"},
    "learner": {"run", "learner", "queue", "process"},
    "actor": {"run", "actor", "process"},
    "node": {"run", "process", "node", "gpu"},
}


class Histogram:
    """Cumulative bucket counts kept as numpy arrays; observations arrive pre-binned."""

    def __init__(self, bounds):
        self.bounds = np.asarray(bounds, dtype=np.float64)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.float64)  # last: +Inf overflow
        self.sum = 0.0

    def observe(self, value: float, count: float = 1.0) -> None:
        self.counts[np.searchsorted(self.bounds, value, side="left")] += count
        self.sum += value * count

    def add_counts(self, counts, total: float) -> None:
        self.counts += np.asarray(counts, dtype=np.float64)
        self.sum += total


def label_sets(metric: Metric, source: str):
    """(labels tuple, stats key) for every bounded label combination of a metric."""
    if not metric.labels:
        return [((), source)]
    names = metric.labels
    combos = product(*(metric.label_values[n] for n in names))
    return [(c, source.format(**dict(zip(names, c, strict=True)))) for c in combos]


class UnknownMetricError(ValueError):
    """A recorder call named a metric, or a label value, that the catalogue does not have."""


def strict_by_default() -> bool:
    """Strict checks in tests (pytest sets PYTEST_CURRENT_TEST, inherited by the runs it starts)."""
    flag = os.environ.get("RLVITALS_STRICT_METRICS", "").strip().lower()
    if flag:
        return flag not in ("0", "false", "no", "off")
    return "PYTEST_CURRENT_TEST" in os.environ


class Recorder:
    """All metric values of one process, keyed by (metric name, label values)."""

    def __init__(self, level: str, component: str = "local", window: int = 100, strict: bool | None = None):
        self.level = level
        self.component = component
        self.strict = strict_by_default() if strict is None else strict
        self._reported: set[str] = set()
        self.lock = threading.Lock()
        self.values: dict[tuple[str, tuple], float] = {}
        self.histograms: dict[str, Histogram] = {}
        self.info: dict[str, str] = {}
        self.returns = deque(maxlen=window)
        self.lengths = deque(maxlen=window)
        self.successes = deque(maxlen=window)
        self.collected = 0.0
        self.learned = 0.0
        wanted = COMPONENTS[component]
        # A learner process never sees record_rollout: it counts what reaches it (learned or dropped).
        self._counts_arrivals = "actor" not in wanted
        self.metrics = [m for m in METRICS if m.at(level) and m.component in wanted]
        self.enabled = {m.name for m in self.metrics}
        self._sources = {m.name: label_sets(m, m.source) for m in self.metrics if m.source and m.kind != "histogram"}
        for m in self.metrics:
            if m.kind == "histogram":
                self.histograms[m.name] = Histogram(m.buckets)
            elif m.kind == "counter" and m.label_values and len(m.labels) == 1:
                for value in m.label_values[m.labels[0]]:
                    self.values[(m.name, (value,))] = 0.0
            elif m.kind == "counter":
                self.values[(m.name, ())] = 0.0

    @property
    def wants_value_trace(self) -> bool:
        return "rlvitals_learner_value_trace" in self.enabled

    @property
    def wants_debug(self) -> bool:
        return self.level == "debug"

    # ------------------------------------------------------------- writers
    def _inc(self, name: str, amount: float, labels: tuple = ()) -> None:
        key = (name, labels)
        if key in self.values:  # the common case: a series seen before
            self.values[key] += amount
        elif self._accepts(name, labels):
            self.values[key] = amount

    def _set(self, name: str, value: float, labels: tuple = ()) -> None:
        key = (name, labels)
        if value == value and (key in self.values or self._accepts(name, labels)):  # NaN: keep the last value
            self.values[key] = float(value)

    def _accepts(self, name: str, labels: tuple) -> bool:
        """A new series: True if exported here; False if not at this level or component; bad names refused."""
        metric = BY_NAME.get(name)
        problem = ""
        if metric is None:
            problem = f"metric {name!r} is not in the catalogue"
        elif len(labels) != len(metric.labels):
            problem = f"metric {name!r} takes labels {metric.labels}, got values {labels}"
        else:
            for label, value in zip(metric.labels, labels, strict=True):
                allowed = metric.label_values.get(label)
                if allowed is not None and value not in allowed:
                    problem = f"metric {name!r}: {label}={value!r} is not one of {allowed}"
        if problem:
            if self.strict:
                raise UnknownMetricError(problem)
            if problem not in self._reported:
                self._reported.add(problem)
                log.warning("not recorded: %s", problem)
            return False
        return name in self.enabled

    def set_info(self, **labels: str) -> None:
        self.info = {k: str(v) for k, v in labels.items()}

    def record_rollout(self, rollout) -> None:
        """Actor-side metrics of one rollout."""
        ep = rollout.episodes
        timings = rollout.timings
        with self.lock:
            self.collected += rollout.env_steps
            self._inc("rlvitals_actor_env_steps_total", rollout.env_steps)
            self._inc("rlvitals_actor_episodes_total", len(ep.returns))
            self._set("rlvitals_actor_network_age", rollout.policy_age)
            for phase in ACTOR_PHASES:
                self._inc("rlvitals_actor_phase_seconds_total", timings.get(phase, 0.0), (phase,))
            finite = np.isfinite(ep.returns)
            if finite.any():  # episodes with a NaN reward have no return to show
                self.returns.extend(ep.returns[finite].tolist())
                self.lengths.extend(ep.lengths[finite].tolist())
                self.successes.extend(ep.successes.tolist())
                for name, window in (("rlvitals_actor_episode_return", self.returns),
                                     ("rlvitals_actor_episode_length", self.lengths)):
                    arr = np.asarray(window, dtype=np.float64)
                    for stat, value in (("min", arr.min()), ("max", arr.max()), ("mean", arr.mean()),
                                        ("std", arr.std())):
                        self._set(name, value, (stat,))
                if self.successes:
                    self._set("rlvitals_actor_solve_ratio", float(np.mean(self.successes)))

    def record_learn(self, stats: dict) -> None:
        """Learner-side metrics of one batch, from the learner's stats dict.

        Counters add the batch's amount (stats key = catalogue `source`); gauges take
        the batch's value; NaN (undefined this batch) leaves a gauge at its last value.
        """
        with self.lock:
            self.learned += stats.get("samples_learned", 0.0)
            if self._counts_arrivals:  # learned or dropped as non-finite, they arrived
                self.collected += stats.get("samples", 0.0) + stats.get("nonfinite_samples", 0.0)
            stats = dict(stats)
            if self.collected:
                stats["training_intensity"] = self.learned / self.collected
            if "rlvitals_learner_sample_staleness_steps" in self.enabled and "staleness" in stats:
                self.histograms["rlvitals_learner_sample_staleness_steps"].observe(stats["staleness"],
                                                                                    stats.get("samples", 0.0))
            for name, pairs in self._sources.items():
                metric = BY_NAME[name]
                if metric.component != "learner":
                    continue
                for labels, key in pairs:
                    if key in stats:
                        if metric.kind == "counter":
                            self._inc(name, stats[key], labels)
                        else:
                            self._set(name, stats[key], labels)
            if stats.get("nonfinite"):
                self._inc("rlvitals_samples_dropped_total", stats.get("nonfinite_samples", 0.0), ("nonfinite",))
            self._debug(stats)

    def _debug(self, stats: dict) -> None:
        if not self.wants_debug:
            return
        for series, key in (("value", "value_trace"), ("reward", "reward_trace")):
            for step, value in enumerate(stats.get(key, ())):
                self._set("rlvitals_learner_value_trace", value, (series, str(step)))
        for key, value in stats.items():
            for prefix, name in (("layer_weight_rms/", "rlvitals_learner_layer_weight_rms"),
                                 ("layer_gradient_rms/", "rlvitals_learner_layer_gradient_rms"),
                                 ("layer_activation_std/", "rlvitals_learner_layer_activation_std"),
                                 ("layer_dead_ratio/", "rlvitals_learner_layer_dead_ratio")):
                if key.startswith(prefix):
                    self._set(name, value, (key[len(prefix):],))
        for name, key in (("rlvitals_learner_value_target_distribution", "target_hist"),
                          ("rlvitals_learner_advantage_distribution", "advantage_hist")):
            if key in stats:
                counts, total = stats[key]
                self.histograms[name].add_counts(counts, total)

    def record_rule_held(self, held: dict[str, float]) -> None:
        """Per health rule, the updates its condition has held (the rule-held gauge's `rule` label)."""
        with self.lock:
            for rule, updates in held.items():
                self._set(HELD_METRIC, updates, (rule,))

    def record_queue(self, depth: int, capacity: int, queue: str = "rollouts") -> None:
        with self.lock:
            self._set("rlvitals_queue_depth", depth, (queue,))
            self._set("rlvitals_queue_capacity", capacity, (queue,))

    def record_dropped(self, reason: str, samples: float) -> None:
        with self.lock:
            if self._counts_arrivals:
                self.collected += samples
            self._inc("rlvitals_samples_dropped_total", samples, (reason,))

    def record_publish(self, num_bytes: float) -> None:
        with self.lock:
            self._inc("rlvitals_weight_publishes_total", 1.0)
            self._inc("rlvitals_weight_publish_bytes_total", num_bytes)

    def record_restarts(self, count: int = 1) -> None:
        with self.lock:
            self._inc("rlvitals_actor_restarts_total", float(count))

    def record_phase(self, phase: str, seconds: float) -> None:
        with self.lock:
            self._inc("rlvitals_learner_phase_seconds_total", seconds, (phase,))

    # ------------------------------------------------------------- readers
    def snapshot(self):
        with self.lock:
            hist = {k: (h.bounds.copy(), h.counts.copy(), h.sum) for k, h in self.histograms.items()}
            return dict(self.values), hist, dict(self.info)

    # ------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        """What a resumed run needs to go on where this one is: every counter, and the intensity totals.

        Plain data only ([name, [label values], value] triples and floats), so it fits a
        `weights_only` checkpoint.
        """
        with self.lock:
            counters = [[name, list(labels), value] for (name, labels), value in self.values.items()
                        if BY_NAME[name].kind == "counter"]
            return {"counters": counters, "collected": self.collected, "learned": self.learned}

    def load_state(self, state: dict) -> None:
        """Counters continue from `state` (of `state()`); counters this process does not export are skipped."""
        with self.lock:
            for name, labels, value in state.get("counters", ()):
                if name in self.enabled:
                    self.values[(name, tuple(labels))] = float(value)
            self.collected = float(state.get("collected", self.collected))
            self.learned = float(state.get("learned", self.learned))
