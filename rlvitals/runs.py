"""`rlvitals runs DIR`: every run under a directory as one sortable, filterable table."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import yaml

from .config import RETIRED_FIELDS, TrainConfig

IDENTITY = ("env", "agent", "seed", "mode", "run_dir", "total_env_steps", "progress", "metrics_port",
            "metrics_host", "log_interval_seconds", "checkpoint_interval", "keep_checkpoints",
            "return_threshold", "stop_at_threshold", "verbosity", "group_readable",
            *RETIRED_FIELDS)  # older runs' config.yaml holds them; they never set anything


def _load(run: Path) -> dict | None:
    """The run's config and summary; None for a folder that is not a readable run (a torn summary is named)."""
    try:
        config = yaml.safe_load((run / "config.yaml").read_text()) or {}
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(config, dict):  # some other tool's config.yaml
        return None
    summary: object = {}
    if (run / "summary.json").is_file():
        try:
            summary = json.loads((run / "summary.json").read_text())
        except (OSError, ValueError):  # torn by a crash mid-write, or not text
            summary = None
    if not isinstance(summary, dict):
        logging.getLogger("rlvitals.runs").warning(
            "skipped run %s: its summary.json is torn or not a JSON object", run)
        return None
    return {"path": str(run), "config": config, "summary": summary}


def collect(directory: str) -> list[dict]:
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"directory {directory!r} does not exist; expected a directory of runs")
    found = [_load(p.parent) for p in sorted(root.rglob("config.yaml"))]
    return [r for r in found if r is not None]


def rows(runs: list[dict]) -> tuple[list[dict], list[str]]:
    """Table rows, plus the config fields that differ between runs (the 'key differences')."""
    defaults = TrainConfig().to_dict()
    varying = sorted({k for r in runs for k, v in r["config"].items()
                      if k not in IDENTITY and any(o["config"].get(k, defaults.get(k)) != v for o in runs)})
    out = []
    for r in runs:
        c, s = r["config"], r["summary"]
        out.append({
            "run": Path(r["path"]).name, "env": c.get("env"), "algorithm": c.get("agent"), "seed": c.get("seed"),
            "differences": " ".join(f"{k}={c.get(k)}" for k in varying),
            "env_steps": s.get("env_steps"), "final_return": s.get("mean_return_last_100"),
            "seconds_to_threshold": s.get("seconds_to_threshold"), "wall_seconds": s.get("wall_seconds"),
            "status": "done" if s else "running/crashed", "path": r["path"]})
    return out, varying


def _matches(row: dict, flt: str) -> bool:
    key, sep, value = flt.partition("=")
    if not sep or key not in row:
        raise ValueError(f"--filter {flt!r} is invalid: expected COLUMN=VALUE with COLUMN one of {', '.join(row)}")
    return str(row[key]) == value


def list_runs(directory: str, sort: str = "-final_return", filters=(), top: int = 0, as_json: bool = False) -> str:
    table, _ = rows(collect(directory))
    if table:
        for flt in filters:
            table = [r for r in table if _matches(r, flt)] if table else table
    key = sort.lstrip("-")
    if table and key not in table[0]:
        raise ValueError(f"--sort {sort!r} is invalid: expected a column: {', '.join(table[0])}")
    present = [r for r in table if r.get(key) is not None]
    missing = [r for r in table if r.get(key) is None]
    present.sort(key=lambda r: r[key], reverse=sort.startswith("-"))
    table = present + missing
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
