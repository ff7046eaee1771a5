"""A small expression language that means the same thing in PromQL and on a run's recorded rows.

Health rules are written once in these terms. Each expression renders to a
PromQL query (for the generated alert rules) and evaluates on a run's recorded
metrics (for the offline evaluator), with Prometheus's semantics:

- a series is the latest sample at or before the evaluation time, looked up no
  further back than `LOOKBACK` seconds (Prometheus's staleness window);
- every series is aggregated `by (run_id)`, so the processes of one run (the
  learner, each actor) meet in one value and binary operators match on run_id;
- a comparison filters: it keeps the left value where it holds and is absent
  where it does not; `and` keeps the left value where both are present.

Only operations whose result is exactly reproducible from the samples are
offered (no rate()/increase() extrapolation): `Delta` is `x - x offset w`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

LOOKBACK = 300.0

Lookup = Callable[[str, float], "float | None"]
"""(row key, time in seconds) -> the recorded value then, or None when absent."""


class Expr:
    def promql(self) -> str:
        raise NotImplementedError

    def value(self, lookup: Lookup, t: float) -> float | None:
        raise NotImplementedError

    def keys(self) -> set[str]:
        """Row keys the expression reads."""
        raise NotImplementedError

    # Arithmetic and comparisons build the tree: S("kl") < 0.01, S("a") / S("b").
    def _bin(self, op, other, swap=False):
        other = other if isinstance(other, Expr) else Num(float(other))
        return Bin(op, other, self) if swap else Bin(op, self, other)

    def __add__(self, o): return self._bin("+", o)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, swap=True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, swap=True)
    def __truediv__(self, o): return self._bin("/", o)
    def __gt__(self, o): return self._bin(">", o)
    def __ge__(self, o): return self._bin(">=", o)
    def __lt__(self, o): return self._bin("<", o)
    def __le__(self, o): return self._bin("<=", o)
    def eq(self, o): return self._bin("==", o)
    def ne(self, o): return self._bin("!=", o)
    def __and__(self, o): return Bin("and", self, o)
    def __or__(self, o): return Bin("or", self, o)


@dataclass(frozen=True, eq=False)
class Num(Expr):
    x: float

    def promql(self) -> str:
        return _number(self.x)

    def value(self, lookup, t):
        return self.x

    def keys(self):
        return set()


@dataclass(frozen=True, eq=False)
class Series(Expr):
    """One catalogue series: `agg by (run_id) (name{labels} offset w)`; offline the row key `key`."""

    name: str
    key: str
    labels: tuple[tuple[str, str], ...] = ()
    agg: str = "max"
    offset: float = 0.0

    def promql(self) -> str:
        sel = self.name + ("{" + ",".join(f'{k}="{v}"' for k, v in self.labels) + "}" if self.labels else "")
        if self.offset:
            sel += f" offset {_duration(self.offset)}"
        return f"{self.agg} by (run_id) ({sel})"

    def value(self, lookup, t):
        return lookup(self.key, t - self.offset)

    def keys(self):
        return {self.key}

    def shifted(self, seconds: float) -> Series:
        return Series(self.name, self.key, self.labels, self.agg, self.offset + seconds)


def Delta(series: Series, seconds: float) -> Expr:
    """How much a series changed over the last `seconds`: x - x offset seconds."""
    return Bin("-", series, series.shifted(seconds))


@dataclass(frozen=True, eq=False)
class AvgOverTime(Expr):
    """`avg_over_time` of a series over the last `seconds`, on the evaluation grid.

    Prometheus (2.x) averages the samples in [t - w, t]; offline the samples are
    the series' values at the grid points in that window, which is exactly what
    a Prometheus scraping once per grid step holds.
    """

    series: Series
    seconds: float
    step: float = 1.0

    def promql(self) -> str:
        s = self.series
        sel = s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in s.labels) + "}" if s.labels else "")
        return f"{s.agg} by (run_id) (avg_over_time({sel}[{_duration(self.seconds)}]))"

    def value(self, lookup, t):
        points = int(round(self.seconds / self.step)) + 1
        values = [v for k in range(points) if (v := lookup(self.series.key, t - k * self.step)) is not None]
        return sum(values) / len(values) if values else None

    def keys(self):
        return {self.series.key}


@dataclass(frozen=True, eq=False)
class Abs(Expr):
    inner: Expr

    def promql(self) -> str:
        return f"abs({self.inner.promql()})"

    def value(self, lookup, t):
        v = self.inner.value(lookup, t)
        return None if v is None else abs(v)

    def keys(self):
        return self.inner.keys()


_ARITH = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_CMP = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _divide(a: float, b: float) -> float:
    """IEEE division, as PromQL does it: x/0 is +-Inf, 0/0 is NaN."""
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
    return a / b


@dataclass(frozen=True, eq=False)
class Bin(Expr):
    op: str
    left: Expr
    right: Expr

    def promql(self) -> str:
        return f"({self.left.promql()}) {self.op} ({self.right.promql()})"

    def value(self, lookup, t):
        a = self.left.value(lookup, t)
        if self.op == "or":
            return a if a is not None else self.right.value(lookup, t)
        b = self.right.value(lookup, t)
        if a is None or b is None:
            return None
        if self.op == "and":
            return a
        if self.op == "/":
            return _divide(a, b)
        if self.op in _ARITH:
            return _ARITH[self.op](a, b)
        # Comparisons filter: the left value survives where the comparison holds (NaN never does).
        return a if _CMP[self.op](a, b) else None

    def keys(self):
        return self.left.keys() | self.right.keys()


def _number(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s != seconds or s <= 0:
        raise ValueError(f"durations are whole positive seconds, got {seconds}")
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


duration = _duration
