"""Just enough PromQL reading to tell which series a query selects.

`selectors(expr)` lists (metric name, label matchers) for each vector selector
in a query, so the dashboards and the alert rules can be checked against the
catalogue: every metric they name must exist, and every matched value of a
closed label must be one the catalogue allows. Not a parser: it assumes the
queries this project writes (no `__name__` matchers, no braces inside strings).
"""

from __future__ import annotations

import re

from rlvitals.telemetry.catalogue import BY_NAME, Metric, exposed_names

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool",
            "inf", "nan", "atan2"}
BUILTIN_SERIES = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds", "scrape_samples_scraped"}
"""Series Prometheus itself makes: allowed in queries without being in the catalogue."""

_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\}|\()?")
_RANGE = re.compile(r"\[[^\]]*\]")
_NUMBER_CONTEXT = re.compile(r"[0-9.]$")
_BRACES_OR_STRING = re.compile(r'(\{[^}]*\})|"(?:[^"\\]|\\.)*"')
"""A selector's {...} (kept: its matchers hold label values) or a string argument outside one (label_join's)."""


def selectors(expr: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """[(metric name, {label: (operator, value)})] for each vector selector of `expr`."""
    text = _BRACES_OR_STRING.sub(lambda m: m.group(1) or '""', expr)  # label names in strings are no metrics
    text = _RANGE.sub("", _GROUPING.sub(" ", text))
    found = []
    for match in _TOKEN.finditer(text):
        name, tail = match.group(1), match.group(2) or ""
        if tail.startswith("(") or name in KEYWORDS:
            continue  # a function, an aggregation or a keyword
        if match.start() and _NUMBER_CONTEXT.search(text[: match.start()]):
            continue  # the exponent of a number (1e-4) or the unit of a duration (offset 1h)
        found.append((name, {label: (op, value) for label, op, value in _MATCHER.findall(tail)}))
    return found


def catalogue_metric(sample_name: str) -> Metric | None:
    """The catalogue metric a series name belongs to (histograms add _bucket, _sum, _count)."""
    if sample_name in BY_NAME:
        return BY_NAME[sample_name]
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample_name.removesuffix(suffix)
        if base != sample_name and base in BY_NAME and sample_name in exposed_names(BY_NAME[base]):
            return BY_NAME[base]
    return None


def problems(expr: str) -> list[str]:
    """What in `expr` disagrees with the catalogue: unknown metrics, label values outside a closed set."""
    out = []
    for name, matchers in selectors(expr):
        if name in BUILTIN_SERIES:
            continue
        m = catalogue_metric(name)
        if m is None:
            out.append(f"{name} is not a catalogue metric (nor one of its histogram series)")
            continue
        for label, (op, value) in matchers.items():
            allowed = m.label_values.get(label)
            if allowed is None or op not in ("=", "=~"):
                continue
            values = value.split("|") if op == "=~" else [value]
            bad = [v for v in values if v not in allowed]
            if bad:
                out.append(f"{name}{{{label}{op}\"{value}\"}}: {bad} not among the catalogue's {list(allowed)}")
    return out


def metric_names(expr: str) -> set[str]:
    """Catalogue names of the metrics `expr` reads (unknown names are left out; see `problems`)."""
    names = set()
    for name, _ in selectors(expr):
        m = catalogue_metric(name)
        if m is not None:
            names.add(m.name)
    return names
