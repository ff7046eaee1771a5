"""Reading a run directory for the report, whatever state the run is in.

A run that is still being written can end metrics.jsonl with half a line; a
run that crashed has no summary.json; a run that was just created has neither
rows nor a summary. All of these load: what is missing is recorded in
`notes` and shown on the page. Only a path that is not a run directory at all
is refused (ReportError, one line).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlvitals.telemetry.health import RowTally, open_rows, parse_rows

from ..config import ConfigError, load_yaml
from ..limits import UnreadableFile
from ..runs import clean_summary
from ..status import RUNNING, run_status, status_and_cause

RUN_FILES = ("config.yaml", "meta.json", "metrics.jsonl")
"""A directory holding any of these was made by `rlvitals train`."""
MAX_POINTS = 2000
"""Points per curve on the page; longer runs are thinned evenly (the last row is always kept)."""


class ReportError(ValueError):
    """Bad input to `rlvitals report` or `rlvitals export`; the message is one line."""


@dataclass
class Run:
    path: Path
    name: str
    config: dict
    meta: dict
    summary: dict | None
    rows: list[dict]
    verdicts: list[dict] | None
    """The verdicts of verdicts.json (or of the health evaluator); None when there are none yet."""
    notes: list[str] = field(default_factory=list)
    """What is missing or was skipped, in words for the page."""
    rows_total: int = 0
    """Rows read before thinning."""
    history: dict | None = None
    """Health rule -> [(run seconds, its condition held)] at each evaluation (None without the evaluator)."""

    @property
    def status(self) -> str:
        """The status word `rlvitals runs` shows too (rlvitals/status.py): running, crashed, or how it ended."""
        return run_status(self.path, self.summary)

    @property
    def cause(self) -> str | None:
        """A failed run's exception in one line; None for any other status."""
        return status_and_cause(self.path, self.summary)[1]

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """(env steps, values) of one metrics key over the rows that have it."""
        xs, ys = [], []
        for row in self.rows:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                xs.append(row.get("env_steps", 0))
                ys.append(float(value))
        return xs, ys

    def numeric_keys(self) -> list[str]:
        keys: dict[str, None] = {}
        for row in self.rows:
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    keys[k] = None
        return list(keys)

    def env_steps_at_seconds(self, seconds: list[float]) -> list[float]:
        """Env steps at run times (linear between rows; clamped to the first and last row)."""
        pts = [(r["wall_seconds"], r.get("env_steps", 0)) for r in self.rows
               if isinstance(r.get("wall_seconds"), (int, float))]
        if not pts:
            return [0.0 for _ in seconds]
        ts, xs = zip(*pts, strict=True)
        return np.interp(np.asarray(seconds, dtype=float), ts, xs).tolist()

    def env_steps_at(self, update: int | None = None, seconds: float | None = None) -> float | None:
        """Env steps of the first row at or after a learner update (or run second)."""
        for row in self.rows:
            if update is not None and row.get("updates", -1) >= update:
                return row.get("env_steps")
            if update is None and seconds is not None and row.get("wall_seconds", -1) >= seconds:
                return row.get("env_steps")
        return None


def check_run_dir(path: str) -> Path:
    """The run directory as a Path, or ReportError naming what is wrong with it."""
    p = Path(path)
    if not p.exists():
        raise ReportError(f"RUN_DIR {path!r} is invalid: it does not exist; expected a run directory "
                          "(made by `rlvitals train`)")
    if not p.is_dir():
        raise ReportError(f"RUN_DIR {path!r} is invalid: it is not a directory; expected a run directory "
                          "(made by `rlvitals train`)")
    if not any((p / name).is_file() for name in RUN_FILES):
        inside = sorted(str(c) for c in p.iterdir() if c.is_dir() and (c / "config.yaml").is_file())[:3]
        if inside:
            raise ReportError(f"RUN_DIR {path!r} is invalid: it is a directory of runs, not a run; expected run "
                              f"directories such as {' '.join(inside)}")
        not_files = [name for name in RUN_FILES if os.path.lexists(p / name)]
        if not_files:  # there, but folders, links to folders, FIFOs: name what they are, not that they are absent
            kinds = ", ".join(f"{name} is {_kind(p / name)}" for name in not_files)
            raise ReportError(f"RUN_DIR {path!r} is invalid: {kinds}; expected a run directory whose "
                              f"{', '.join(RUN_FILES)} are regular files (made by `rlvitals train`)")
        raise ReportError(f"RUN_DIR {path!r} is invalid: it holds none of {', '.join(RUN_FILES)}; expected a run "
                          "directory (made by `rlvitals train`)")
    return p


def _kind(path: Path) -> str:
    """What a path that is not a regular file is, in words."""
    if path.is_symlink():
        return "a symbolic link" + (" to a directory" if path.is_dir() else "")
    return "a directory" if path.is_dir() else "not a regular file"


def deduped(rows: Iterable[dict]) -> Iterator[dict]:
    """Rows with one that repeats the previous row's (updates, env_steps) merged into it: the final row of a run
    can."""
    pending = None
    for row in rows:
        if pending is not None and (row.get("updates"), row.get("env_steps")) == (pending.get("updates"),
                                                                                   pending.get("env_steps")):
            pending = {**pending, **row}
            continue
        if pending is not None:
            yield pending
        pending = row
    if pending is not None:
        yield pending


def stream_rows(path: Path, tally: RowTally) -> Iterator[dict]:
    """metrics.jsonl's usable rows, deduplicated, one at a time (health.parse_rows: bad lines and values
    skipped and counted in `tally`); nothing when there is no metrics.jsonl. OSError for a file that is no
    regular file or cannot be read."""
    stream = open_rows(path)
    if stream is None:
        return
    with stream:
        yield from deduped(parse_rows(stream, tally))


def _read_json(path: Path, notes: list[str], what: str):
    from ..limits import JSON_BYTES_MAX, read_bounded

    if not os.path.lexists(path):
        return None
    try:
        return json.loads(read_bounded(path, JSON_BYTES_MAX, what))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: torn, not JSON, too large, no regular file
        why = " ".join(str(exc).split()) if isinstance(exc, UnreadableFile) else type(exc).__name__
        notes.append(f"{what} could not be read ({why}); it is left out")
        return None


class _Health:
    """The health monitor fed one row at a time; None verdicts when it is not there or failed."""

    def __init__(self, run_id: str, notes: list[str]):
        self.notes, self.monitor = notes, None
        try:
            from rlvitals.telemetry.health import HealthMonitor
        except ImportError:
            return
        self.monitor = HealthMonitor(run_id=run_id)
        self.monitor.record_history()

    def __call__(self, row: dict) -> None:
        if self.monitor is not None:
            self._guarded(self.monitor, row)

    def result(self) -> tuple[list[dict] | None, dict | None]:
        if self.monitor is None:
            return None, None
        verdicts = self._guarded(lambda _: [v.to_dict() for v in self.monitor.finish()], None)
        return (None, None) if self.monitor is None else (verdicts, self.monitor.history)

    def _guarded(self, fn, arg):
        try:
            return fn(arg)
        except Exception as exc:  # the report must not die of a rule's bug; say so instead
            self.notes.append(f"the health evaluator failed on this run ({type(exc).__name__}: {exc})")
            self.monitor = None
            return None


def read_rows(path: Path, run_id: str, notes: list[str], max_points: int = MAX_POINTS):
    """(rows thinned evenly to `max_points`, rows in all, verdicts and rule history of the health evaluator).

    Two passes over metrics.jsonl, each holding one row at a time: the first counts the rows and finds the
    run's rows, the second feeds the health monitor and keeps the rows to plot. Memory is bounded by
    `max_points` whatever the run's length; rows appended between the passes are left for the next report.
    """
    tally = RowTally()
    try:
        total = sum(1 for _ in stream_rows(path, RowTally()))
        health = _Health(run_id, notes)
        stride = (total - 1) / (max_points - 1) if total > max_points else 1.0
        kept: list[dict] = []
        for i, row in enumerate(stream_rows(path, tally)):
            if i >= total:
                break
            health(row)
            if i == round(len(kept) * stride):
                kept.append(row)
    except OSError as exc:
        notes.append(f"metrics.jsonl could not be read ({exc.strerror or exc}); no rows are shown")
        return [], 0, None, None
    if tally.bad_lines:
        notes.append(f"{tally.bad_lines} line(s) of metrics.jsonl did not parse and were skipped "
                     "(a partial last line is normal while the run writes)")
    if tally.bad_values:
        notes.append(f"{tally.bad_values} value(s) in metrics.jsonl were no usable number (text, null, beyond "
                     "64 bits) and were skipped")
    if total > max_points:
        notes.append(f"{total} rows thinned evenly to {max_points} points per curve")
    return kept, total, *health.result()


def load_verdicts(run_dir: Path, evaluated: list[dict] | None, notes: list[str]) -> list[dict] | None:
    """verdicts.json's verdicts when present (those that are objects with fields of the right types), else
    the evaluator's; None when neither."""
    path = run_dir / "verdicts.json"
    if not os.path.lexists(path):
        return evaluated
    data = _read_json(path, notes, "verdicts.json")
    if isinstance(data, list):
        kept = [v for v in data if valid_verdict(v)]
        if len(kept) < len(data):
            notes.append(f"{len(data) - len(kept)} of verdicts.json's {len(data)} entries are not verdicts "
                         "(fields of the wrong type) and were left out")
        return kept
    if data is not None:
        notes.append("verdicts.json is not a JSON list; it is left out")
    return evaluated


VERDICT_TEXT = ("rule", "severity", "component", "message")
VERDICT_NUMBERS = ("first_seconds", "first_update")


def valid_verdict(v) -> bool:
    """A verdict as health.Verdict writes it: text fields text (or absent), times numbers (or null)."""
    return (isinstance(v, dict) and all(isinstance(v.get(k, ""), str) for k in VERDICT_TEXT)
            and all(v.get(k) is None or _finite(v[k]) for k in VERDICT_NUMBERS))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300


META_TEXT = ("run_id", "started_at", "hostname", "python", "platform")


def clean_meta(meta, notes: list[str]) -> dict:
    """meta.json with the fields the page shows of the types it shows them as (text, a command as a list of
    words, the code version as a mapping); others are left out and noted."""
    if not isinstance(meta, dict):
        if meta is not None:
            notes.append("meta.json is not a JSON object; it is left out")
        return {}
    kept = {k: v for k, v in meta.items() if k not in META_TEXT or isinstance(v, str)}
    if not (isinstance(kept.get("command", []), list) and all(isinstance(w, str) for w in kept.get("command", []))):
        kept.pop("command")
    if not isinstance(kept.get("code_version", {}), dict):
        kept.pop("code_version")
    if len(kept) < len(meta):
        notes.append(f"{len(meta) - len(kept)} field(s) of meta.json were of the wrong type and were left out")
    return kept


def load_run(path: str, max_points: int = MAX_POINTS) -> Run:
    run_dir = check_run_dir(path)
    notes: list[str] = []
    config: dict = {}
    if not os.path.lexists(run_dir / "config.yaml"):
        notes.append("no config.yaml")
    else:
        try:
            config = load_yaml(run_dir / "config.yaml", what="config.yaml")
        except ConfigError as exc:
            notes.append(f"{' '.join(str(exc).split())}; the config is left out")
    meta = clean_meta(_read_json(run_dir / "meta.json", notes, "meta.json"), notes)
    summary = _read_json(run_dir / "summary.json", notes, "summary.json")
    if summary is None:
        notes.append("no summary.json: " + ("the run is still running (a live process holds its lock)"
                                            if run_status(run_dir, None) == RUNNING else
                                            "it crashed (it ended without writing one, and no process holds its lock)"))
    elif not isinstance(summary, dict):
        summary = None
    else:
        summary, dropped = clean_summary(summary)
        if dropped:
            notes.append(f"{dropped} value(s) of summary.json were of the wrong type or beyond 64 bits and were "
                         "left out")
    rows, total, evaluated, history = read_rows(run_dir / "metrics.jsonl", str(meta.get("run_id", "")), notes,
                                                max_points)
    if not rows:
        notes.append("no metrics rows yet: nothing to plot")
    verdicts = load_verdicts(run_dir, evaluated, notes)
    return Run(run_dir, run_dir.resolve().name, config, meta, summary, rows, verdicts, notes, total, history)


def unique_names(runs: list[Run]) -> None:
    """Give runs with the same directory name distinct names (parent/name)."""
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
    for run in runs:
        if seen[run.name] > 1:
            run.name = f"{run.path.resolve().parent.name}/{run.name}"
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.name] = counts.get(run.name, 0) + 1
        if counts[run.name] > 1:
            run.name = f"{run.name} ({counts[run.name]})"
