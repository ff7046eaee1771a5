"""`rlvitals runs DIR`: every run under a directory as one sortable, filterable table."""

from __future__ import annotations

import difflib
import json
import logging
import os
from pathlib import Path
from typing import get_origin

import yaml

from .config import RETIRED_FIELDS, ConfigError, TrainConfig, coerce, field_types, load_yaml
from .config_yaml import parse_yaml
from .limits import JSON_BYTES_MAX, read_bounded
from .status import status_and_cause

IDENTITY = ("env", "agent", "seed", "mode", "run_dir", "total_env_steps", "progress", "metrics_port",
            "metrics_host", "log_interval_seconds", "checkpoint_interval", "keep_checkpoints",
            "return_threshold", "stop_at_threshold", "verbosity", "group_readable",
            *RETIRED_FIELDS)  # older runs' config.yaml holds them; they never set anything


SUMMARY_TEXT = ("algorithm", "status", "cause", "archive_error")
"""summary.json's text fields; every other field is a number, null, or a mapping of them (samples, verdicts)."""


def clean_summary(summary: dict, depth: int = 0) -> tuple[dict, int]:
    """summary.json with only the values a reader can use, and how many were dropped: text where a number
    belongs, a 400-digit integer, a list. A run directory may come from anyone; one bad value loses that
    value, never the run or the table."""
    from rlvitals.telemetry.health import usable_number

    kept, dropped = {}, 0
    for key, value in summary.items():
        if key in SUMMARY_TEXT:
            ok = value is None or isinstance(value, str)
        elif isinstance(value, dict) and depth < 2:
            value, inner = clean_summary(value, depth + 1)
            ok, dropped = True, dropped + inner
        else:
            ok = value is None or usable_number(value)
        if ok:
            kept[key] = value
        else:
            dropped += 1
    return kept, dropped


def _load(run: Path) -> dict | None:
    """The run's config and summary; None for a folder that is not a readable run (a torn summary is named)."""
    try:
        config = load_yaml(run / "config.yaml", what="config.yaml")
    except ConfigError as exc:  # some other tool's config.yaml, or a hostile one: named, never expanded
        logging.getLogger("rlvitals.runs").warning("skipped run %s: %s", run, " ".join(str(exc).split()))
        return None
    summary: object = {}
    if os.path.lexists(run / "summary.json"):
        try:
            summary = json.loads(read_bounded(run / "summary.json", JSON_BYTES_MAX, "summary.json"))
        except (OSError, ValueError, RecursionError):  # torn by a crash mid-write, not text, a FIFO, too large
            summary = None
    if not isinstance(summary, dict):
        logging.getLogger("rlvitals.runs").warning(
            "skipped run %s: its summary.json is torn or not a JSON object", run)
        return None
    summary, dropped = clean_summary(summary)
    if dropped:
        logging.getLogger("rlvitals.runs").warning(
            "run %s: %d value(s) of its summary.json are of the wrong type or beyond 64 bits; shown as -", run, dropped)
    return {"path": str(run), "config": config, "summary": summary}


def collect(directory: str) -> list[dict]:
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"directory {directory!r} does not exist; expected a directory of runs")
    found = [_load(p.parent) for p in _config_files(root)]
    return [r for r in found if r is not None]


def _config_files(root: Path) -> list[Path]:
    """Every config.yaml under `root`, links to folders not followed; a folder that cannot be read is named
    (it may be the very run looked for), never passed over in silence."""
    def unreadable(exc: OSError) -> None:
        logging.getLogger("rlvitals.runs").warning("skipped %s: it cannot be read (%s)", exc.filename,
                                                   exc.strerror or exc)

    return sorted(Path(folder) / "config.yaml" for folder, subfolders, files in os.walk(root, onerror=unreadable)
                  if "config.yaml" in files or "config.yaml" in subfolders)


def rows(runs: list[dict]) -> tuple[list[dict], list[str]]:
    """Table rows, plus the config fields that differ between runs (the 'key differences')."""
    defaults = TrainConfig().to_dict()
    varying = sorted({k for r in runs for k, v in r["config"].items()
                      if k not in IDENTITY and any(o["config"].get(k, defaults.get(k)) != v for o in runs)})
    out = []
    for r in runs:
        c, s = r["config"], r["summary"]
        status, cause = status_and_cause(r["path"], s)  # cause: a failed run's one line, else None
        out.append({
            "run": Path(r["path"]).name, "env": c.get("env"), "algorithm": c.get("agent"), "seed": c.get("seed"),
            "differences": " ".join(f"{k}={c.get(k)}" for k in varying),
            "env_steps": s.get("env_steps"), "final_return": s.get("mean_return_last_100"),
            "seconds_to_threshold": s.get("seconds_to_threshold"), "wall_seconds": s.get("wall_seconds"),
            "status": status, "cause": cause, "path": r["path"]})
    return out, varying


_ABSENT = object()  # a key missing from a run's mapping field
_FIELD_TYPES = field_types()
_DEFAULTS = TrainConfig().to_dict()


class _Key:
    """What --filter and --sort name: a column of the table, a config field, or FIELD.KEY inside a mapping field."""

    def __init__(self, name: str, columns, flag: str, given: str):
        self.name, self.field, self.path = name, None, ()
        field, _, inner = name.partition(".")
        if name in _FIELD_TYPES:
            self.field = name
        elif inner and get_origin(_FIELD_TYPES.get(field)) is dict:
            self.field, self.path = field, tuple(inner.split("."))
        elif name not in columns:
            mappings = [f for f, hint in _FIELD_TYPES.items() if get_origin(hint) is dict]
            close = difflib.get_close_matches(name, [*columns, *_FIELD_TYPES], n=2)
            raise ValueError(
                f"{flag} {given!r} is invalid: {name!r} is neither a column nor a config field"
                + (f" (did you mean {' or '.join(close)}?)" if close else "")
                + f"; expected a column ({', '.join(columns)}) or a config field ({', '.join(_FIELD_TYPES)})"
                + (f", or FIELD.KEY inside {' or '.join(mappings)}" if mappings else ""))

    def value(self, row: dict, config: dict):
        """The run's value, typed as the config field is (a run older than the field has its default)."""
        if self.field is None:
            return row.get(self.name)
        value = config.get(self.field, _DEFAULTS[self.field])
        try:
            value = coerce(self.field, value)
        except ConfigError:  # written by another version or by hand: compared as it is
            pass
        for step in self.path:
            value = value.get(step, _ABSENT) if isinstance(value, dict) else _ABSENT
        return None if value is _ABSENT else value

    def wanted(self, text: str, given: str):
        """A --filter value as the key's values are typed: 1e-3 equals 0.001, true equals yes, 64,64 a tuple."""
        try:
            if self.path:
                return parse_yaml(text)
            return coerce(self.field, text) if self.field else text
        except (ConfigError, yaml.YAMLError) as exc:
            raise ValueError(f"--filter {given!r}: {' '.join(str(exc).split())}") from None


def _equal(value, wanted, typed: bool) -> bool:
    if typed:  # both sides have the field's type (or, inside a mapping, YAML's)
        return value == wanted
    if str(value) == wanted:
        return True
    try:  # a table column: 200 finds 200.0
        return value is not None and float(value) == float(wanted)
    except (TypeError, ValueError):
        return False


def _order(value) -> tuple:
    """A sort key every value has, whatever its type: numbers, then text, then lists of numbers, then the rest."""
    if isinstance(value, (bool, int, float)):
        try:
            return (0, float(value))
        except OverflowError:  # an integer beyond float range (a hand-edited config): past every float
            return (0, float("inf") if value > 0 else float("-inf"))
    if isinstance(value, str):
        return (1, value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return (2, tuple(float(v) for v in value))
    return (3, json.dumps(value, sort_keys=True, default=str))


def select(table: list[dict], configs: list[dict], sort: str, filters=()) -> list[dict]:
    """The rows whose runs pass every KEY=VALUE filter, sorted by KEY (-KEY: descending); runs lacking it last."""
    if not table:
        return table
    columns = list(table[0])
    runs = list(zip(table, configs, strict=True))
    for flt in filters:
        name, sep, text = flt.partition("=")
        if not sep:
            raise ValueError(f"--filter {flt!r} is invalid: expected KEY=VALUE with KEY a column "
                             f"({', '.join(columns)}) or a config field")
        key = _Key(name, columns, "--filter", flt)
        wanted = key.wanted(text, flt)
        runs = [(row, config) for row, config in runs if _equal(key.value(row, config), wanted, key.field is not None)]
    key = _Key(sort.lstrip("-"), columns, "--sort", sort)
    valued = [(key.value(row, config), row) for row, config in runs]
    present = sorted(((value, row) for value, row in valued if value is not None), key=lambda pair: _order(pair[0]),
                     reverse=sort.startswith("-"))
    return [row for _, row in present] + [row for value, row in valued if value is None]


def list_runs(directory: str, sort: str = "-final_return", filters=(), top: int = 0, as_json: bool = False) -> str:
    runs = collect(directory)
    table, _ = rows(runs)
    table = select(table, [r["config"] for r in runs], sort, filters)
    if top > 0:
        table = table[:top]
    if as_json:
        return json.dumps(table, indent=2)
    return format_table(table)


def format_table(table: list[dict]) -> str:
    columns = ["run", "env", "algorithm", "seed", "differences", "env_steps", "final_return",
               "seconds_to_threshold", "wall_seconds", "status"]
    if not table:
        return "no runs found"

    def cell(v):
        if v is None:
            return "-"
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    grid = [columns] + [[cell(r[c]) for c in columns] for r in table]
    widths = [max(len(row[i]) for row in grid) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in grid)
