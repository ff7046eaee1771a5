"""A small expression language for health-rule conditions, evaluated on a run's evidence.

Health rules are written once in these terms and evaluated on the rows of a run
(live by the run's own health monitor, or replayed from metrics.jsonl), on the
run's evidence axis: the learner's update count, never wall-clock seconds. So a
run reaches the same verdicts at the same update on a fast and a slow machine.

- a series is the latest recorded value at or before the evaluation's update
  (a gauge keeps its last value, as an exporter's does);
- `Delta(s, n)` is how much `s` changed over the last `n` updates, `Mean(s, n)`
  its mean over the last `n` updates, `Median(s, n)` their median, `s.shifted(n)` its value `n` updates ago;
  each is undefined until the run has that many updates behind it, except
  `Increase(counter, n)`, which counts a counter from 0 before its first record;
- a comparison filters: it keeps the left value where it holds and is absent
  where it does not; `and` keeps the left value where both are present.

`text()` renders a condition for docs/health.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

Lookup = Callable[[str, float], "float | None"]
"""(row key, update) -> the recorded value then, or None when absent."""


class Expr:
    def value(self, lookup: Lookup, u: float) -> float | None:
        raise NotImplementedError

    def keys(self) -> set[str]:
        """Row keys the expression reads."""
        raise NotImplementedError

    def reach(self) -> float:
        """How many updates back the expression looks."""
        return 0.0

    def text(self) -> str:
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

    def value(self, lookup, u):
        return self.x

    def keys(self):
        return set()

    def text(self) -> str:
        return _number(self.x)


@dataclass(frozen=True, eq=False)
class Series(Expr):
    """The row key `key` (a catalogue metric's source), `offset` updates ago."""

    key: str
    offset: float = 0.0

    def value(self, lookup, u):
        return lookup(self.key, u - self.offset)

    def keys(self):
        return {self.key}

    def reach(self) -> float:
        return self.offset

    def text(self) -> str:
        return f"{self.key}[{_updates(self.offset)} ago]" if self.offset else self.key

    def shifted(self, updates: float) -> Series:
        return Series(self.key, self.offset + updates)


def Delta(series: Series, updates: float) -> Expr:
    """How much a series changed over the last `updates` updates: x - x `updates` ago."""
    return Bin("-", series, series.shifted(updates))


@dataclass(frozen=True, eq=False)
class Increase(Expr):
    """How much a counter rose over the last `updates` updates; before its first record a counter was 0, so a
    run younger than the window (or one whose every batch is dropped, its update count standing still) counts
    from the start."""

    series: Series
    updates: int

    def value(self, lookup, u):
        now = self.series.value(lookup, u)
        if now is None:
            return None
        then = self.series.value(lookup, u - self.updates)
        return now - (0.0 if then is None else then)

    def keys(self):
        return self.series.keys()

    def reach(self) -> float:
        return self.series.reach() + self.updates

    def text(self) -> str:
        return f"increase of {self.series.text()} over {_updates(self.updates)}"


@dataclass(frozen=True, eq=False)
class _Window(Expr):
    """A series' values over the last `updates` updates, the current one included."""

    series: Series
    updates: int

    def window(self, lookup, u) -> list[float]:
        return [v for k in range(self.updates + 1) if (v := self.series.value(lookup, u - k)) is not None]

    def keys(self):
        return self.series.keys()

    def reach(self) -> float:
        return self.series.reach() + self.updates


class Mean(_Window):
    """A series' mean over the last `updates` updates."""

    def value(self, lookup, u):
        values = self.window(lookup, u)
        return sum(values) / len(values) if values else None

    def text(self) -> str:
        return f"mean of {self.series.text()} over {_updates(self.updates)}"


class Median(_Window):
    """A series' median over the last `updates` updates: what most of them read, which one outlier does not move
    (a rule about every update is not fired by two spikes)."""

    def value(self, lookup, u):
        values = self.window(lookup, u)
        return statistics.median(values) if values else None

    def text(self) -> str:
        return f"median of {self.series.text()} over {_updates(self.updates)}"


@dataclass(frozen=True, eq=False)
class Abs(Expr):
    inner: Expr

    def value(self, lookup, u):
        v = self.inner.value(lookup, u)
        return None if v is None else abs(v)

    def keys(self):
        return self.inner.keys()

    def reach(self) -> float:
        return self.inner.reach()

    def text(self) -> str:
        return f"|{self.inner.text()}|"


_ARITH = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_CMP = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _divide(a: float, b: float) -> float:
    """IEEE division: x/0 is +-Inf, 0/0 is NaN (which no comparison keeps)."""
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
    return a / b


@dataclass(frozen=True, eq=False)
class Bin(Expr):
    op: str
    left: Expr
    right: Expr

    def value(self, lookup, u):
        a = self.left.value(lookup, u)
        if self.op == "or":
            return a if a is not None else self.right.value(lookup, u)
        b = self.right.value(lookup, u)
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

    def reach(self) -> float:
        return max(self.left.reach(), self.right.reach())

    def text(self) -> str:
        def side(e: Expr) -> str:
            return f"({e.text()})" if isinstance(e, Bin) and e.op in ("and", "or") + tuple(_CMP) else e.text()
        return f"{side(self.left)} {self.op} {side(self.right)}"


def _number(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return f"{x:g}"


def _updates(n: float) -> str:
    n = int(n)
    return f"{n} update" + ("" if n == 1 else "s")


def duration(seconds: float) -> str:
    """A Prometheus duration (`for:` of the live-only rules): whole seconds as `30s`, `5m`, `1h`."""
    s = int(seconds)
    if s != seconds or s <= 0:
        raise ValueError(f"durations are whole positive seconds, got {seconds}")
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"
