"""The health monitor: the health rules judged on a run's recorded rows, counted in evidence.

Every row is one evaluation, on the run's evidence axis: the learner's update
count (telemetry/conditions.py). A rule fires once its condition has held at
every row over `hold` updates, so the same run gives the same verdicts at the
same update however fast the machine is. The verdict's `first_update` and
`first_seconds` say where the streak that fired began.

`HealthMonitor` takes rows one at a time (a run loop's row observer), reports
each rule the moment it fires, and hands how many updates each rule has held
to `on_held` (the run exports it as `rlvitals_rule_held_updates`, which the
Prometheus alerts read, so they and verdicts.json agree); `evaluate_rows` and
`evaluate_run` replay a recorded run and find the same verdicts.
"""

from __future__ import annotations

import bisect
import errno
import json
import math
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from .rules import RULES, Rule
from .verdicts import Verdict, write_verdicts

AXIS_KEY = "updates"
"""The evidence axis: rules are judged at the learner update each row records."""
TIME_KEY = "wall_seconds"
VERDICTS_FILE = "verdicts.json"
NOT_HELD = -1
"""What `on_held` reports for a rule whose condition does not hold now."""


class RowSeries:
    """Every recorded value of each row key, in update order, for look-ups at any update."""

    def __init__(self, keys: Iterable[str] | None = None):
        self.keys = set(keys) if keys is not None else None
        self.at: dict[str, list[float]] = {}
        self.values: dict[str, list[float]] = {}
        self.last = -math.inf

    def add(self, row: dict) -> bool:
        """Record a row; False (nothing recorded) for one without an update count or behind the last one (a
        resumed run's overlap), which cannot be placed."""
        u = row.get(AXIS_KEY)
        if isinstance(u, bool) or not isinstance(u, (int, float)) or math.isnan(u) or u < self.last:
            return False
        self.last = u = float(u)
        # The keys the rules read, not every key of the row: a row holds a few hundred.
        pairs = row.items() if self.keys is None else ((k, row[k]) for k in self.keys.intersection(row))
        for key, value in pairs:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                continue
            self.at.setdefault(key, []).append(u)
            self.values.setdefault(key, []).append(float(value))
        return True

    def lookup(self, key: str, u: float) -> float | None:
        """The latest value recorded at or before update `u` (a gauge keeps its last value)."""
        at = self.at.get(key)
        if not at:
            return None
        if at[-1] <= u + 1e-9:   # the common case: the latest row's value
            return self.values[key][-1]
        i = bisect.bisect_right(at, u + 1e-9) - 1
        return self.values[key][i] if i >= 0 else None

    def prune(self, before: float) -> None:
        """Forget values no evaluation can reach any more (keeps memory flat on week-long runs)."""
        for key, at in self.at.items():
            cut = bisect.bisect_left(at, before) - 1  # keep the last value before the cut for look-ups there
            if cut > 0:
                del at[:cut]
                del self.values[key][:cut]


def _extend(history: list[tuple[float, bool]], t: float, holds: bool) -> None:
    if len(history) >= 2 and history[-1][1] == history[-2][1] == holds:
        history[-1] = (t, holds)   # the run of equal outcomes goes on: only its latest row moves
    else:
        history.append((t, holds))


def _message(rule: Rule, value: float | None, update: float, seconds, run_id: str, names: str | None = None) -> str:
    summary = rule.summary.replace("{{ $labels.run_id }}", run_id or "this run")
    when = f" at update {update:.0f}" + (f", {seconds:.0f} s" if isinstance(seconds, (int, float)) else "")
    if rule.value_key:       # an invariant: its statistic against its limit, not the update its flag holds
        limit = f", limit {rule.value_limit:.4g}" if rule.value_limit is not None else ""
        seen = f" (statistic {value:.4g}{limit};{when})" if value is not None else f" ({when.lstrip()})"
    else:
        seen = f" (value {value:.4g}{when})" if value is not None else ""
    named = f" Named: {names}." if names else ""
    return f"{summary}{seen}.{named} {rule.check}"


class HealthMonitor:
    """Judges every rule on the rows of one run as they arrive."""

    def __init__(self, rules: Iterable[Rule] = RULES, run_id: str = "", on_verdict=None,
                 on_held: Callable[[dict[str, int]], None] | None = None):
        # Judged upstream first, so verdicts of one row fire (and print) in the stages' order.
        self.rules = sorted((r for r in rules if not r.live_only), key=lambda r: r.rank)
        self.rank = {r.name: r.rank for r in self.rules}
        self._exprs = [(r, r.expr) for r in self.rules]   # built once: `expr` wraps the warm-up gate anew
        self.run_id = run_id
        self.on_verdict, self.on_held = on_verdict, on_held
        keys = set().union(*(r.expr.keys() | {k for k in (r.update_key, r.value_key) if k} for r in self.rules))
        self.series = RowSeries(keys | {AXIS_KEY})
        self.reach = max((r.expr.reach() for r in self.rules), default=0.0)
        self.since: dict[str, tuple[float, float | None]] = {}
        """Rule -> (update, run seconds) of the first row of its condition's current streak."""
        self.fired: dict[str, Verdict] = {}
        self.history: dict[str, list[tuple[float, bool]]] | None = None
        self.names_keys = sorted({r.names_key for r in self.rules if r.names_key})
        self.names: dict[str, str] = {}
        """names_key -> the latest text naming the processes behind a rule's evidence (rows carry it)."""

    def record_history(self) -> None:
        """Keep every rule's outcome as (run seconds, held), the first and the latest row of each run of equal
        outcomes (the report draws the spans; memory grows with the changes, not with the rows)."""
        self.history = {r.name: [] for r in self.rules}

    def __call__(self, row: dict) -> None:
        if not self.series.add(row):
            return
        for key in self.names_keys:
            if isinstance(row.get(key), str):
                self.names[key] = row[key]
        t = row.get(TIME_KEY)
        self._evaluate(self.series.last, float(t) if isinstance(t, (int, float)) else None)
        self.series.prune(self.series.last - self.reach)

    def finish(self) -> list[Verdict]:
        """The verdicts, in the order they fired (every row is judged as it arrives)."""
        return self.verdicts()

    def close(self, run_dir: str | Path) -> None:
        """End of the run (a row observer's finisher): the verdicts go to RUN_DIR/verdicts.json."""
        write_verdicts(Path(run_dir) / VERDICTS_FILE, self.finish())

    def verdicts(self) -> list[Verdict]:
        # Of verdicts at the same update, the first stage's first (telemetry.invariants.STAGES): the naming rule.
        return sorted(self.fired.values(), key=lambda v: (v.first_update is None, v.first_update or 0,
                                                          v.first_seconds or 0.0, self.rank.get(v.rule, 0), v.rule))

    def _evaluate(self, u: float, t: float | None) -> None:
        lookup = self.series.lookup
        held = {}
        for rule, expr in self._exprs:
            value = expr.value(lookup, u)
            holds = value is not None
            if self.history is not None and t is not None:
                _extend(self.history[rule.name], t, holds)
            if not holds:
                self.since.pop(rule.name, None)
                if not rule.alert_query:
                    held[rule.name] = NOT_HELD
                continue
            start, start_t = self.since.setdefault(rule.name, (u, t))
            if not rule.alert_query:
                held[rule.name] = int(u - start)
            if rule.name not in self.fired and u - start >= rule.hold:
                # The evidence's own update where the rule carries it (invariants), else where the streak began.
                update = lookup(rule.update_key, u) if rule.update_key else start
                verdict = Verdict(rule.name, rule.severity, rule.component,
                                  None if start_t is None else round(start_t, 3),
                                  None if update is None else int(update),
                                  _message(rule, lookup(rule.value_key, u) if rule.value_key else value, u, t,
                                           self.run_id, self.names.get(rule.names_key)))
                self.fired[rule.name] = verdict
                if self.on_verdict is not None:
                    self.on_verdict(verdict)
        if self.on_held is not None:
            self.on_held(held)


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


TEXT_KEYS = frozenset(r.names_key for r in RULES if r.names_key)
"""Row keys that hold text: which processes a rule's evidence comes from (a rule's `names_key`)."""
TEXT_MAX = 2000
"""Characters of such a text at most (five actors named, with their speeds, take about 400)."""


def clean_row(row: dict) -> tuple[dict, int]:
    """The row with only values a reader can use (finite numbers, int64 integers, lists of them: the
    histograms; printable text of at most TEXT_MAX characters under TEXT_KEYS), and how many values were
    dropped (a 400-digit integer, another string, a mapping, null).

    A run directory may come from anyone: every reader of recorded rows goes through here."""
    out, dropped = {}, 0
    for key, value in row.items():
        if usable_number(value) or (isinstance(value, list) and _numbers(value)) or (
                key in TEXT_KEYS and isinstance(value, str) and len(value) <= TEXT_MAX and value.isprintable()):
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


def evaluate_rows(rows: Iterable[dict], rules: Iterable[Rule] = RULES, run_id: str = "") -> list[Verdict]:
    monitor = HealthMonitor(rules, run_id)
    for row in rows:
        monitor(row)
    return monitor.finish()


def evaluate_run(run_dir: str | Path) -> list[Verdict]:
    run_dir = Path(run_dir)
    run_id = ""
    meta = run_dir / "meta.json"
    if meta.exists():
        try:
            run_id = str(json.loads(meta.read_text()).get("run_id", ""))
        except (json.JSONDecodeError, OSError):
            pass
    return evaluate_rows(read_rows(run_dir / "metrics.jsonl"), run_id=run_id)


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
