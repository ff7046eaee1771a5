"""The offline health evaluator: the health rules applied to a run's recorded rows.

It evaluates the same expressions the Prometheus alert rules are generated
from, the way Prometheus does: on a grid of evaluation times (every `step`
seconds of run time), each series is the latest recorded value within the
look-back window, and a rule fires once its condition has held at every
evaluation for `hold_seconds`. So a finished run's verdicts are what a
Prometheus that scraped it would have alerted on (tests check this with
`promtool test rules` on the same series).

`HealthMonitor` takes rows one at a time (a run loop's row observer) and
reports each rule the moment it fires; `evaluate_rows` and `evaluate_run`
replay a recorded run.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable
from pathlib import Path

from .promexpr import LOOKBACK
from .rules import RULES, Rule
from .verdicts import Verdict, write_verdicts

TIME_KEY = "wall_seconds"
DEFAULT_STEP = 1.0
VERDICTS_FILE = "verdicts.json"


class RowSeries:
    """Every recorded value of each row key, in time order, for look-ups at any time."""

    def __init__(self, keys: Iterable[str] | None = None):
        self.keys = set(keys) if keys is not None else None
        self.times: dict[str, list[float]] = {}
        self.values: dict[str, list[float]] = {}
        self.last_time = -math.inf

    def add(self, row: dict) -> None:
        t = row.get(TIME_KEY)
        if not isinstance(t, (int, float)) or t < self.last_time:
            return  # rows without a time, or out of order (a resumed run's overlap), cannot be placed
        self.last_time = float(t)
        for key, value in row.items():
            if self.keys is not None and key not in self.keys:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                continue
            self.times.setdefault(key, []).append(float(t))
            self.values.setdefault(key, []).append(float(value))

    def lookup(self, key: str, t: float) -> float | None:
        times = self.times.get(key)
        if not times:
            return None
        i = bisect.bisect_right(times, t + 1e-9) - 1
        if i < 0 or t - times[i] > LOOKBACK:
            return None
        return self.values[key][i]

    def prune(self, before: float) -> None:
        """Forget values no evaluation can reach any more (keeps memory flat on week-long runs)."""
        for key, times in self.times.items():
            cut = bisect.bisect_left(times, before) - 1  # keep the last value before the cut for look-back
            if cut > 0:
                del times[:cut]
                del self.values[key][:cut]


def _message(rule: Rule, value: float | None, t: float, run_id: str) -> str:
    summary = rule.summary.replace("{{ $labels.run_id }}", run_id or "this run")
    seen = f" (value {value:.4g} at {t:.0f} s)" if value is not None else ""
    return f"{summary}{seen}. {rule.check}"


class HealthMonitor:
    """Evaluates every rule on the rows of one run as they arrive."""

    def __init__(self, rules: Iterable[Rule] = RULES, step: float = DEFAULT_STEP, run_id: str = "",
                 on_verdict=None):
        self.rules = [r for r in rules if not r.live_only]
        self.step = step
        self.run_id = run_id
        self.on_verdict = on_verdict
        keys = set().union(*(r.expr.keys() for r in self.rules)) | {"updates"}
        self.series = RowSeries(keys)
        self.reach = LOOKBACK + max((_max_offset(r) for r in self.rules), default=0.0) + \
            max((r.hold_seconds for r in self.rules), default=0)
        self.next_eval = 0.0
        self.pending: dict[str, float] = {}
        self.fired: dict[str, Verdict] = {}
        self.history: dict[str, list[tuple[float, bool]]] | None = None

    def record_history(self) -> None:
        """Keep every rule's per-evaluation outcome (the report draws it)."""
        self.history = {r.name: [] for r in self.rules}

    def __call__(self, row: dict) -> None:
        t = row.get(TIME_KEY)
        if not isinstance(t, (int, float)):
            return
        # Rows arrive in time order: every evaluation time before this row is final now.
        self._evaluate_until(float(t), inclusive=False)
        self.series.add(row)

    def finish(self) -> list[Verdict]:
        """Evaluate up to the last row and return the verdicts, in the order they fired."""
        if self.series.last_time > -math.inf:
            self._evaluate_until(self.series.last_time, inclusive=True)
        return self.verdicts()

    def close(self, run_dir: str | Path) -> None:
        """End of the run (a row observer's finisher): the verdicts go to RUN_DIR/verdicts.json."""
        write_verdicts(Path(run_dir) / VERDICTS_FILE, self.finish())

    def verdicts(self) -> list[Verdict]:
        return sorted(self.fired.values(), key=lambda v: (v.first_seconds, v.rule))

    def _evaluate_until(self, t: float, inclusive: bool) -> None:
        while self.next_eval < t or (inclusive and self.next_eval <= t + 1e-9):
            self._evaluate_at(self.next_eval)
            self.next_eval = round(self.next_eval + self.step, 9)
        self.series.prune(self.next_eval - self.reach)

    def _evaluate_at(self, t: float) -> None:
        lookup = self.series.lookup
        for rule in self.rules:
            value = rule.expr.value(lookup, t)
            holds = value is not None
            if self.history is not None:
                self.history[rule.name].append((t, holds))
            if not holds:
                self.pending.pop(rule.name, None)
                continue
            since = self.pending.setdefault(rule.name, t)
            if rule.name not in self.fired and t - since >= rule.hold_seconds - 1e-9:
                update = lookup("updates", since)
                verdict = Verdict(rule.name, rule.severity, rule.component, round(since, 3),
                                  None if update is None else int(update), _message(rule, value, t, self.run_id))
                self.fired[rule.name] = verdict
                if self.on_verdict is not None:
                    self.on_verdict(verdict)


def _max_offset(rule: Rule) -> float:
    from .promexpr import Abs, AvgOverTime, Bin, Series

    def walk(e) -> float:
        if isinstance(e, Series):
            return e.offset
        if isinstance(e, AvgOverTime):
            return e.series.offset + e.seconds
        if isinstance(e, Bin):
            return max(walk(e.left), walk(e.right))
        if isinstance(e, Abs):
            return walk(e.inner)
        return 0.0

    return walk(rule.expr)


def read_rows(path: str | Path) -> list[dict]:
    """metrics.jsonl rows; a partial last line (a run still writing, or killed mid-line) is skipped."""
    rows = []
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return rows
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def evaluate_rows(rows: Iterable[dict], rules: Iterable[Rule] = RULES, step: float = DEFAULT_STEP,
                  run_id: str = "") -> list[Verdict]:
    monitor = HealthMonitor(rules, step, run_id)
    for row in rows:
        monitor(row)
    return monitor.finish()


def evaluate_run(run_dir: str | Path, step: float = DEFAULT_STEP) -> list[Verdict]:
    run_dir = Path(run_dir)
    run_id = ""
    meta = run_dir / "meta.json"
    if meta.exists():
        try:
            run_id = str(json.loads(meta.read_text()).get("run_id", ""))
        except (json.JSONDecodeError, OSError):
            pass
    return evaluate_rows(read_rows(run_dir / "metrics.jsonl"), step=step, run_id=run_id)


def bands_for(key: str) -> list[tuple[float | None, float | None]]:
    """The healthy range of a row key that the rules' thresholds imply ([(low, high)], None where open)."""
    from .rules import RULES, thresholds

    low = high = None
    for rule in RULES:
        for k, op, value in thresholds(rule):
            if k != key:
                continue
            if op in (">", ">="):
                high = value if high is None else min(high, value)
            else:
                low = value if low is None else max(low, value)
    return [] if low is None and high is None else [(low, high)]
