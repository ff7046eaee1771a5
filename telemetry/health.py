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
import errno
import json
import math
import os
import stat
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
                # The evidence's own update where the rule carries it (invariants), else the one in force then.
                update = lookup(rule.update_key, t) if rule.update_key else lookup("updates", since)
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


INT_MAX = 2**63 - 1
"""Integers a row may hold: int64, as the counters that write them (a TensorBoard step is one too)."""
LINE_MAX = 1 << 20
"""Bytes of one metrics.jsonl line at most (a row is a few kilobytes; a debug row with histograms, tens)."""


class RowTally:
    """What reading metrics.jsonl skipped: lines that are no JSON object, and values that are no usable number."""

    def __init__(self):
        self.bad_lines = 0
        self.bad_values = 0


def usable_number(value) -> bool:
    """A finite number within float and int64 range (bools count: they are 0 and 1)."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -INT_MAX <= value <= INT_MAX
    return isinstance(value, float) and math.isfinite(value)


def clean_row(row: dict) -> tuple[dict, int]:
    """The row with only values a reader can use (finite numbers, int64 integers, lists of them: the
    histograms), and how many values were dropped (a 400-digit integer, a string, a mapping, null).

    A run directory may come from anyone: every reader of recorded rows goes through here."""
    out, dropped = {}, 0
    for key, value in row.items():
        if usable_number(value) or (isinstance(value, list) and _numbers(value)):
            out[key] = value
        else:
            dropped += 1
    return out, dropped


def _numbers(items: list, depth: int = 0) -> bool:
    """A histogram's [[bucket counts], total]: numbers, or lists of numbers, two levels at most."""
    return all(usable_number(v) or (depth == 0 and isinstance(v, list) and _numbers(v, 1)) for v in items)


def _lines(stream, tally: RowTally):
    """The lines of a binary stream, each at most LINE_MAX bytes: a longer one is skipped as bad, and never
    held whole in memory."""
    while True:
        line = stream.readline(LINE_MAX + 1)
        if not line:
            return
        if len(line) > LINE_MAX and not line.endswith(b"\n"):
            tally.bad_lines += 1
            while line and not line.endswith(b"\n"):  # the rest of the long line
                line = stream.readline(LINE_MAX)
            continue
        yield line


def parse_rows(stream, tally: RowTally):
    """Rows of a binary metrics.jsonl stream, one at a time, cleaned (clean_row); what was skipped is counted
    in `tally`. A partial last line (a run still writing, or killed mid-line) counts as one bad line."""
    for line in _lines(stream, tally):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # torn, not JSON, a number beyond Python's digit limit, too deep
            tally.bad_lines += 1
            continue
        if not isinstance(row, dict):
            tally.bad_lines += 1
            continue
        row, dropped = clean_row(row)
        tally.bad_values += dropped
        yield row


def open_rows(path: str | Path):
    """metrics.jsonl opened for reading, or None when there is none; OSError (EINVAL) for a file that is no
    regular file (a FIFO would block for ever, /dev/zero never ends)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return open(fd, "rb")


def read_rows(path: str | Path) -> list[dict]:
    """metrics.jsonl rows, cleaned; lines and values that cannot be used are skipped (parse_rows)."""
    stream = open_rows(path)
    if stream is None:
        return []
    with stream:
        return list(parse_rows(stream, RowTally()))


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
