"""The few lines a person reads at the end of a run, beside the JSON line scripts read."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..status import COMPLETED, FAILED, recorded_cause, recorded_status

SEVERITIES = ("critical", "warning", "info")


def final_return(summary: dict, last_row: dict | None = None) -> float | None:
    value = summary.get("mean_return_last_100")
    if value is None and last_row:
        value = last_row.get("mean_return_last_100", last_row.get("return_mean"))
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def speed(summary: dict, last_row: dict | None = None) -> float | None:
    if summary.get("env_steps_per_second") is not None:
        return summary["env_steps_per_second"]
    if last_row and last_row.get("wall_seconds"):
        return last_row.get("env_steps", 0) / last_row["wall_seconds"]
    return None


def verdict_counts(verdicts: list[dict] | None) -> dict[str, int] | None:
    """Verdicts per severity (every severity present, in order), or None when there are none to count."""
    if verdicts is None:
        return None
    counts = {s: 0 for s in SEVERITIES}
    for v in verdicts:
        counts[v.get("severity", "info")] = counts.get(v.get("severity", "info"), 0) + 1
    return counts


def _verdicts_of(run_dir: Path) -> list[dict] | None:
    try:
        data = json.loads((run_dir / "verdicts.json").read_text())
    except (OSError, ValueError):
        return None
    return [v for v in data if isinstance(v, dict)] if isinstance(data, list) else None


def _n(x, spec: str = ",") -> str:
    return "-" if x is None else format(x, spec)


def format_run_summary(summary: dict, run_dir) -> str:
    """A short human summary of a finished (or stopped) run: return, steps, speed, verdicts, where things are."""
    run_dir = Path(run_dir)
    status = recorded_status(summary)
    head = f"rlvitals: run {status}" if status in (COMPLETED, FAILED) else f"rlvitals: run stopped ({status})"
    ret = final_return(summary)
    lines = [f"{head} after {_n(summary.get('wall_seconds'), ',.1f')} s: {_n(summary.get('env_steps'))} env steps "
             f"at {_n(speed(summary), ',.0f')} steps/s, {_n(summary.get('updates'))} updates, "
             f"{_n(summary.get('episodes'))} episodes",
             f"  return      {_n(ret, ',.2f')} (mean of the last 100 episodes)"]
    if recorded_cause(summary):
        lines.insert(1, f"  cause       {recorded_cause(summary)}")
    if summary.get("return_threshold") is not None:
        solved = summary.get("seconds_to_threshold")
        lines[-1] += (f"; threshold {summary['return_threshold']:g} reached after {solved:,.1f} s, "
                      f"{_n(summary.get('env_steps_to_threshold'))} env steps" if solved is not None
                      else f"; threshold {summary['return_threshold']:g} not reached")
    if summary.get("nonfinite_batches_skipped"):
        lines.append(f"  skipped     {summary['nonfinite_batches_skipped']} batches with NaN/inf (see the archive)")
    verdicts = _verdicts_of(run_dir)
    counts = verdict_counts(verdicts)
    if counts is None:
        lines.append("  verdicts    not evaluated yet (no verdicts.json)")
    else:
        lines.append("  verdicts    " + ", ".join(f"{n} {sev}" for sev, n in counts.items())
                     + ("" if verdicts else ": every health rule held quiet (docs/health.md)"))
        for v in verdicts:  # one line each: what fired, where, and when it first held
            when = f" from {v['first_seconds']:g} s" if isinstance(v.get("first_seconds"), (int, float)) else ""
            lines.append(f"    {v.get('severity', '?'):8s} [{v.get('component', '?')}] {v.get('rule', '?')}{when}")
    report = run_dir / "report.html"
    lines.append(f"  report      {report}" if report.is_file() else f"  report      rlvitals report {run_dir}")
    if any(run_dir.glob("events.out.tfevents.*")):
        lines.append(f"  tensorboard tensorboard --logdir {run_dir}")
    lines.append(f"  archive     {run_dir}/ (config.yaml, metrics.jsonl, summary.json, checkpoints/)")
    return "\n".join(lines)
