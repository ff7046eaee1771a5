"""Which metrics.jsonl keys are which catalogue signals, how the dashboards group them, and their bands.

The catalogue's `source` is the metrics.jsonl key of a signal (with a label,
a pattern such as `value_{stat}`); the dashboards' rows and panels
(rlvitals.dashboards.content) say which signals are read together. The report
takes both from code, so a signal that moves on the dashboards moves here too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from itertools import product

from rlvitals.telemetry.bands import Band, catalogue_bands
from rlvitals.telemetry.catalogue import BY_NAME, METRICS, Metric

RUN_COUNTERS = ("updates", "env_steps", "episodes", "learner_steps")
"""Row keys that hold the run's running totals (the other counter keys hold one update's amount)."""
AXIS_KEYS = ("env_steps", "wall_seconds")
ALIASES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "mean_return_last_100": ("rlvitals_actor_episode_return", ("mean",), "mean of last 100"),
    "rss_bytes": ("rlvitals_process_resident_memory_bytes", (), ""),
    "dropped_stale": ("rlvitals_samples_dropped_total", ("stale",), "stale"),
    "dropped_nonfinite": ("rlvitals_samples_dropped_total", ("nonfinite",), "nonfinite"),
}
"""Row keys written by the run loop for signals whose catalogue entry names no `source`."""
LAYER_PREFIX = "rlvitals_learner_"
"""Debug layer statistics arrive as `layer_weight_rms/<layer>`: the metric name less this prefix, a slash, the layer."""
REFERENCE = "docs/metrics.md"

@dataclass(frozen=True)
class Signal:
    key: str
    """The metrics.jsonl key."""
    metric: Metric
    labels: tuple[str, ...]
    word: str
    """Legend word within its panel (the label value, or the alias's word)."""


@dataclass
class Panel:
    group: str
    title: str
    help: str
    metrics: tuple[str, ...]
    signals: list[Signal] = field(default_factory=list)
    log: bool = False
    unit: str = "none"
    words: dict = field(default_factory=dict)
    """Legend word of each metric of a several-metric panel (the dashboards' legend)."""

    @property
    def view(self) -> str:
        """`rate` (counters), `band` (stat-labelled gauges) or `lines`."""
        ms = [BY_NAME[n] for n in self.metrics]
        if ms and all(m.kind == "counter" for m in ms):
            return "rate"
        if len(ms) == 1 and ms[0].labels == ("stat",):
            return "band"
        return "lines"


def _sources() -> dict[str, tuple[Metric, tuple[str, ...]]]:
    out = {}
    for m in METRICS:
        if not m.source:
            continue
        if not m.labels:
            out[m.source] = (m, ())
            continue
        combos = product(*(m.label_values.get(n, ()) for n in m.labels))
        for combo in combos:
            out[m.source.format(**dict(zip(m.labels, combo, strict=True)))] = (m, combo)
    return out


SOURCES = _sources()


def signal_of(key: str) -> Signal | None:
    """The catalogue signal a metrics.jsonl key records, or None."""
    if key in SOURCES:
        m, labels = SOURCES[key]
        return Signal(key, m, labels, " ".join(labels))
    if key in ALIASES:
        name, labels, word = ALIASES[key]
        return Signal(key, BY_NAME[name], labels, word)
    prefix, slash, layer = key.partition("/")
    if slash and (LAYER_PREFIX + prefix) in BY_NAME:
        return Signal(key, BY_NAME[LAYER_PREFIX + prefix], (layer,), layer)
    return None


def anchor(metric_name: str) -> str:
    """The id of a metric's section in docs/metrics.md (and on the report page)."""
    return metric_name


def _dashboard_rows():
    """(row title, [dashboard panel]) in dashboard order, or None when the dashboards cannot be imported."""
    try:
        from rlvitals.dashboards.content import DASHBOARDS
    except ImportError:
        try:
            from rlvitals.dashboards.generate import DASHBOARDS
        except ImportError:
            return None
    try:
        return [(row.title, row.panels) for make in DASHBOARDS.values() for row in make().rows]
    except Exception:  # a dashboard spec being edited must not take the report down
        return None


def _is_log(panel) -> bool:
    custom = getattr(panel, "custom", {}) or {}
    return custom.get("scaleDistribution", {}).get("type") == "log"


def _words(panel) -> dict[str, str]:
    """Metric -> the word its dashboard legend gives it, where a panel has one query per metric."""
    targets = getattr(panel, "targets", None) or []
    if len(panel.metrics) < 2 or len(targets) != len(panel.metrics):
        return {}
    return {name: re.sub(r"\{\{\w+\}\}", "", t.get("legendFormat", "")).strip()
            for name, t in zip(panel.metrics, targets, strict=True)}


def _help(panel, ms: list[Metric]) -> str:
    try:
        return panel.description()
    except Exception:
        return "\n\n".join(m.help for m in ms)


def panels_for(keys: list[str]) -> list[Panel]:
    """The report's panels for the keys present in the runs: dashboard groups first, then the rest."""
    by_metric: dict[str, list[Signal]] = {}
    for key in keys:
        sig = signal_of(key)
        if sig is not None:
            by_metric.setdefault(sig.metric.name, []).append(sig)
    # an alias only where the signal's own key is absent
    for name, sigs in by_metric.items():
        direct = {s.labels for s in sigs if s.key not in ALIASES}
        by_metric[name] = [s for s in sigs if s.key not in ALIASES or s.labels not in direct]
    out: list[Panel] = []
    shown: set[str] = set()
    rows = _dashboard_rows()
    if rows is None:  # group by catalogue component instead
        rows = [(comp.capitalize(), [_Plain((n,)) for n in by_metric if BY_NAME[n].component == comp])
                for comp in dict.fromkeys(m.component for m in METRICS)]
    for group, dash_panels in rows:
        for dp in dash_panels:
            if getattr(dp, "kind", "timeseries") not in ("timeseries", "heatmap"):
                continue
            names = tuple(n for n in dp.metrics if n in by_metric)
            sigs = [s for n in names for s in by_metric[n]]
            if not sigs or {s.key for s in sigs} <= shown:
                continue
            ms = [BY_NAME[n] for n in dp.metrics]
            title = getattr(dp, "title", "") or names[0]
            out.append(Panel(group, title.replace(" (heatmap)", ""), _help(dp, ms), names, sigs, _is_log(dp),
                             ms[0].unit, _words(dp)))
            shown.update(s.key for s in sigs)
    for name, sigs in by_metric.items():  # on no dashboard panel (should not happen): still shown
        rest = [s for s in sigs if s.key not in shown]
        if rest:
            m = BY_NAME[name]
            out.append(Panel("Other catalogue signals", name, m.help, (name,), rest, False, m.unit))
            shown.update(s.key for s in rest)
    return out


@dataclass
class _Plain:
    metrics: tuple[str, ...]
    kind: str = "timeseries"

    @property
    def title(self) -> str:
        return self.metrics[0]

    def description(self) -> str:
        return BY_NAME[self.metrics[0]].help


def uncatalogued(keys: list[str]) -> list[str]:
    """Numeric row keys that are no catalogue signal (shown in their own section)."""
    skip = set(AXIS_KEYS) | {"updates"}
    return [k for k in keys if k not in skip and signal_of(k) is None]


# ------------------------------------------------------------------ bands
def bands_for(metric_key: str) -> list[Band]:
    """Healthy bands of a metrics.jsonl key, outermost first; None is an open end (a threshold line).

    The health rules (rlvitals.telemetry.health) are asked first, so the bands
    they define are the ones drawn; until they answer for a key, the bands that
    the key's catalogue help text states in numbers are used (never for a
    `std` statistic, whose scale the text does not describe).
    """
    try:
        from rlvitals.telemetry import health
    except ImportError:
        health = None
    ask = getattr(health, "bands_for", None)
    if ask is not None:
        try:
            found = ask(metric_key)
        except Exception:
            found = None
        if found:
            return [(_num(lo), _num(hi)) for lo, hi in found]
    sig = signal_of(metric_key)
    if sig is None or "std" in sig.labels:
        return []
    return catalogue_bands(sig.metric.help)


def thresholds_for(metric_key: str) -> list[tuple[str, str, float, str, bool]]:
    """(rule, comparison, value, severity, alone) of every health rule that compares this key with a number.

    A rule fires when its comparison holds, together with its other conditions
    unless `alone`, so the line marks where healthy ends. Empty when the health
    rules are not there.
    """
    try:
        from rlvitals.telemetry.rules import RULES, thresholds
    except ImportError:
        return []
    found = []
    for rule in RULES:
        try:
            alone = len(rule.condition.keys()) == 1
            found += [(rule.name, op, float(x), rule.severity, alone) for key, op, x in thresholds(rule)
                      if key == metric_key]
        except Exception:  # a rule being edited must not take the report down
            continue
    return found


def _rule_keys(rule_name: str) -> set[str]:
    try:
        from rlvitals.telemetry.rules import BY_RULE

        return set(BY_RULE[rule_name].condition.keys())
    except (ImportError, KeyError, AttributeError):
        return set()


def rule_severity(rule_name: str) -> str:
    try:
        from rlvitals.telemetry.rules import BY_RULE

        return BY_RULE[rule_name].severity
    except (ImportError, KeyError, AttributeError):
        return "info"


def rule_doc(rule_name: str) -> str | None:
    """The anchor of a rule's section in docs/health.md, when the rules are there."""
    try:
        from rlvitals.telemetry.rules import BY_RULE

        return BY_RULE[rule_name].anchor
    except (ImportError, KeyError, AttributeError):
        return None


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def outside(value: float, bands: list[Band]) -> bool:
    """Outside the outermost band."""
    if not bands:
        return False
    lo, hi = bands[0]
    return (lo is not None and value < lo) or (hi is not None and value > hi)


# ------------------------------------------------------------------ verdicts
_NAME = re.compile(r"rlvitals_[a-z0-9_]+")


def verdict_metrics(verdict: dict) -> list[str]:
    """Catalogue metrics a verdict names (by metric name, or by a row key in its rule or message)."""
    text = f"{verdict.get('rule', '')} {verdict.get('message', '')}"
    found = [signal_of(k).metric.name for k in sorted(_rule_keys(str(verdict.get("rule")))) if signal_of(k)]
    found += [n for n in _NAME.findall(text) if n in BY_NAME]
    if verdict.get("metric") in BY_NAME:
        found.insert(0, verdict["metric"])
    for word in re.findall(r"[a-z][a-z0-9_]+", text) if not found else ():  # a rule we do not know: its words
        sig = signal_of(word)
        if sig is not None and len(word) > 2:
            found.append(sig.metric.name)
    return list(dict.fromkeys(found))


_GROUPS: dict[str, str] | None = None


def group_of(metric_name: str) -> str:
    """The dashboard row a catalogue metric is first shown in (its catalogue component when on none)."""
    global _GROUPS
    if _GROUPS is None:
        _GROUPS = {}
        for group, dash_panels in _dashboard_rows() or ():
            for dp in dash_panels:
                if getattr(dp, "kind", "timeseries") in ("timeseries", "heatmap"):
                    for name in dp.metrics:
                        _GROUPS.setdefault(name, group)
    return _GROUPS.get(metric_name) or BY_NAME[metric_name].component.capitalize()
