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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import ConfigError, load_yaml
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
        raise ReportError(f"RUN_DIR {path!r} is invalid: it holds none of {', '.join(RUN_FILES)}; expected a run "
                          "directory (made by `rlvitals train`)")
    return p


def read_rows(path: Path) -> tuple[list[dict], int]:
    """The rows of metrics.jsonl that parse as JSON objects, and how many lines did not."""
    rows, bad = [], 0
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def dedupe(rows: list[dict]) -> list[dict]:
    """Drop a row that repeats the previous row's (updates, env_steps): the final row of a run can."""
    out: list[dict] = []
    for row in rows:
        if out and (row.get("updates"), row.get("env_steps")) == (out[-1].get("updates"), out[-1].get("env_steps")):
            out[-1] = {**out[-1], **row}
        else:
            out.append(row)
    return out


def thin(rows: list[dict], limit: int = MAX_POINTS) -> list[dict]:
    """At most `limit` rows, evenly spaced, first and last kept."""
    if len(rows) <= limit:
        return rows
    step = (len(rows) - 1) / (limit - 1)
    return [rows[round(i * step)] for i in range(limit)]


def _read_json(path: Path, notes: list[str], what: str):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        notes.append(f"{what} could not be read ({type(exc).__name__}); it is left out")
        return None


HISTORY_POINTS = 20_000
"""Most rule evaluations per rule when the page evaluates a run itself (longer runs: a coarser grid)."""


def evaluate_health(rows: list[dict], run_id: str, notes: list[str]):
    """(verdicts, history) of the offline health evaluator over the rows; (None, None) when it is not there.

    history: rule -> [(run seconds, condition held)] at every evaluation time.
    """
    try:
        from rlvitals.telemetry.health import DEFAULT_STEP, HealthMonitor
    except ImportError:
        return None, None
    times = [r["wall_seconds"] for r in rows if isinstance(r.get("wall_seconds"), (int, float))]
    step = max(DEFAULT_STEP, (times[-1] if times else 0) / HISTORY_POINTS)
    if step > DEFAULT_STEP:
        notes.append(f"health rules evaluated every {step:.1f} s of run time (not every {DEFAULT_STEP:g} s): "
                     "a long run")
    try:
        monitor = HealthMonitor(step=step, run_id=run_id)
        monitor.record_history()
        for row in rows:
            monitor(row)
        verdicts = [v.to_dict() for v in monitor.finish()]
    except Exception as exc:  # the report must not die of a rule's bug; say so instead
        notes.append(f"the health evaluator failed on this run ({type(exc).__name__}: {exc})")
        return None, None
    return verdicts, monitor.history


def load_verdicts(run_dir: Path, rows: list[dict], run_id: str, notes: list[str]):
    """(verdicts, rule history): verdicts.json's verdicts when present, else the evaluator's; None when neither."""
    verdicts, history = evaluate_health(rows, run_id, notes)
    path = run_dir / "verdicts.json"
    if path.is_file():
        data = _read_json(path, notes, "verdicts.json")
        if isinstance(data, list):
            return [v for v in data if isinstance(v, dict)], history
        if data is not None:
            notes.append("verdicts.json is not a JSON list; it is left out")
    return verdicts, history


def load_run(path: str, max_points: int = MAX_POINTS) -> Run:
    run_dir = check_run_dir(path)
    notes: list[str] = []
    config: dict = {}
    if not (run_dir / "config.yaml").exists():
        notes.append("no config.yaml")
    else:
        try:
            config = load_yaml(run_dir / "config.yaml", what="config.yaml")
        except ConfigError as exc:
            notes.append(f"{' '.join(str(exc).split())}; the config is left out")
    meta = _read_json(run_dir / "meta.json", notes, "meta.json") or {}
    summary = _read_json(run_dir / "summary.json", notes, "summary.json")
    if summary is None:
        notes.append("no summary.json: " + ("the run is still running (a live process holds its lock)"
                                            if run_status(run_dir, None) == RUNNING else
                                            "it crashed (it ended without writing one, and no process holds its lock)"))
    elif not isinstance(summary, dict):
        summary = None
    rows, bad = read_rows(run_dir / "metrics.jsonl")
    if bad:
        notes.append(f"{bad} line(s) of metrics.jsonl did not parse and were skipped "
                     "(a partial last line is normal while the run writes)")
    if not rows:
        notes.append("no metrics rows yet: nothing to plot")
    rows = dedupe(rows)
    total = len(rows)
    if total > max_points:
        notes.append(f"{total} rows thinned evenly to {max_points} points per curve")
    verdicts, history = load_verdicts(run_dir, rows, str(meta.get("run_id", "")), notes)
    return Run(run_dir, run_dir.resolve().name, config, meta, summary, thin(rows, max_points), verdicts, notes,
               total, history)


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
