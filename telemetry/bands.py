"""Healthy bands the catalogue states in numbers.

A metric's help text says what healthy looks like ("Healthy: below about 0.3",
"healthy targets read at most about 1"); this reads the numbers out of those
sentences, so the report and the dashboards draw the band the text states and
nobody types it a second time. The health rules' thresholds are the other
source of what healthy looks like (telemetry.rules).
"""

from __future__ import annotations

import re

Band = tuple[float | None, float | None]
"""(low, high) of a healthy range; None is an open end."""

_NUM = r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)"
BAND_PATTERNS = (  # phrases of the catalogue's help text that state a healthy range in numbers
    (re.compile(rf"within \[{_NUM}, {_NUM}\]"), lambda a, b: (a, b)),
    (re.compile(rf"ideally \[{_NUM}, {_NUM}\]"), lambda a, b: (a, b)),
    (re.compile(rf"healthy:? {_NUM} ?(?:-|to) ?{_NUM}", re.I), lambda a, b: (a, b)),
    (re.compile(rf"(?:below|at most|under) (?:about )?{_NUM}"), lambda a: (None, a)),
    (re.compile(rf"(?:above|at least|over) (?:about )?{_NUM}"), lambda a: (a, None)),
)


def catalogue_bands(help_text: str) -> list[Band]:
    """Healthy bands stated in a help text's sentences about what healthy looks like, outermost first."""
    found: list[Band] = []
    for sentence in re.split(r"(?<=[.;])\s+", help_text):
        if "healthy" not in sentence.lower():
            continue
        for pattern, make in BAND_PATTERNS:
            for groups in pattern.findall(sentence):
                groups = groups if isinstance(groups, tuple) else (groups,)
                found.append(make(*(float(g) for g in groups)))
    return list(dict.fromkeys(found))


def band_text(band: Band) -> str:
    """'<= 0.3', '>= 0' or '[-10, 10]'."""
    lo, hi = band
    if lo is None:
        return f"<= {hi:g}"
    if hi is None:
        return f">= {lo:g}"
    return f"[{lo:g}, {hi:g}]"
