"""Healthy at a glance: a panel's health-rule thresholds and catalogue healthy bands as Grafana threshold steps.

Both come from their one source, never typed here: each health rule's leading
`signal OP number` (telemetry.rules) and the ranges a metric's help text states
in numbers (telemetry.bands). A panel's y axis is cut at every threshold and
band edge, and each piece is shaded by what holds there: the colour of the most
severe rule that fires (red critical, orange warning, yellow info), else green
inside a stated healthy band, else nothing. Grafana draws a line at every edge
(the colour of the shaded side) and the shading behind the series.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from rlvitals.telemetry.bands import band_text, catalogue_bands
from rlvitals.telemetry.catalogue import BY_NAME, ROW_KEYS
from rlvitals.telemetry.rules import RULES, thresholds

SEVERITY_COLOURS = {"critical": "red", "warning": "orange", "info": "yellow"}
"""Most severe first: where several rules fire, the first of these that fires gives the colour."""
HEALTHY_COLOUR = "green"
NO_COLOUR = "transparent"
COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@dataclass(frozen=True)
class Threshold:
    """One health rule's line on one metric: where `metric{labels} OP value` starts to fire."""

    value: float
    op: str
    rule: str
    severity: str
    labels: tuple[tuple[str, str], ...] = ()

    def fires(self, y: float) -> bool:
        return COMPARE[self.op](y, self.value)

    def text(self) -> str:
        where = "".join(f"{{{k}={v}}}" for k, v in self.labels)
        return f"{self.rule} ({where}{' ' if where else ''}{self.op} {self.value:g}, {self.severity})"


STD = ("stat", "std")
"""A band panel draws std on its own right-hand axis, where the left axis's lines would not belong."""


def rule_thresholds(metric_names: tuple[str, ...]) -> list[Threshold]:
    """Every threshold the health rules put on these metrics (any of their label values but a std)."""
    found = []
    for rule in RULES:
        for key, op, value in thresholds(rule):
            metric, labels = ROW_KEYS[key]
            if metric.name in metric_names and STD not in labels:
                found.append(Threshold(value, op, rule.name, rule.severity, labels))
    return sorted(set(found), key=lambda t: (t.value, t.op, t.rule))


def stated_bands(metric_names: tuple[str, ...]) -> list[tuple[float | None, float | None]]:
    """The healthy ranges the metrics' help texts state in numbers (not of stat-labelled ones: which stat?)."""
    bands = [band for name in metric_names if "stat" not in BY_NAME[name].labels
             for band in catalogue_bands(BY_NAME[name].help)]
    return list(dict.fromkeys(bands))


def colour_at(y: float, rules: list[Threshold], bands: list) -> str:
    """What a value y is on this panel: the colour of the most severe rule firing, green in a stated band, or none."""
    firing = {t.severity for t in rules if t.fires(y)}
    for severity, colour in SEVERITY_COLOURS.items():
        if severity in firing:
            return colour
    inside = any((lo is None or y >= lo) and (hi is None or y <= hi) for lo, hi in bands)
    return HEALTHY_COLOUR if inside else NO_COLOUR


def threshold_steps(metric_names: tuple[str, ...], log_scale: bool = False) -> list[dict]:
    """Grafana's absolute threshold steps for a panel of these metrics; empty when nothing is known of them.

    The base step (value None) colours everything below the lowest edge. On a log axis edges at or below 0
    cannot be drawn and are left out (the lowest drawn step takes over below it).
    """
    rules, bands = rule_thresholds(metric_names), stated_bands(metric_names)
    edges = sorted({t.value for t in rules} | {e for band in bands for e in band if e is not None})
    if log_scale:
        edges = [e for e in edges if e > 0]
    if not edges:
        return []

    def probe(i: int) -> float:
        """A value inside the piece of axis above edge i (below every edge for i = -1)."""
        if i < 0:
            return edges[0] - max(1.0, abs(edges[0]))
        if i + 1 < len(edges):
            return (edges[i] + edges[i + 1]) / 2
        return edges[i] + max(1.0, abs(edges[i]))

    steps = [{"color": colour_at(probe(-1), rules, bands), "value": None}]
    steps += [{"color": colour_at(probe(i), rules, bands), "value": edge} for i, edge in enumerate(edges)]
    return steps


def legend_text(metric_names: tuple[str, ...]) -> str:
    """A sentence for the panel description saying what the shading means and where each number comes from."""
    parts = []
    rules = rule_thresholds(metric_names)
    if rules:
        parts.append("Shaded where a health rule fires if it lasts (red: critical, orange: warning, yellow: info): "
                     + ", ".join(t.text() for t in rules) + " (docs/health.md)")
    bands = stated_bands(metric_names)
    if bands:
        parts.append("green: the healthy range the metric reference states ("
                     + ", ".join(band_text(b) for b in bands) + ")")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "." if text else ""

