"""TensorBoard event files of a run: written live by a row observer, or afterwards from metrics.jsonl.

    rlvitals train --tensorboard ...           # event files in the run directory while it runs
    rlvitals export tensorboard RUN_DIR        # the same files for an existing run, from metrics.jsonl
    tensorboard --logdir runs                  # every run, overlaid

One event per metrics row holds every numeric value of the row as a scalar,
tagged `<dashboard row>/<metrics.jsonl key>` (e.g. `policy/kl`), at step =
env steps. At `debug` verbosity, rows that carry the learner's value-target
and advantage histograms also get histogram events. The writer is
tensorboardX's (protobuf only, no TensorFlow).
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

from rlvitals.telemetry.catalogue import SIGNED_BUCKETS

from .rundata import ReportError, check_run_dir, read_rows
from .signals import group_of, signal_of

EVENT_GLOB = "events.out.tfevents.*"
HISTOGRAMS = {"target_hist": ("distributions/value_target", "target"),
              "advantage_hist": ("distributions/advantage", "advantage")}
"""Row key of a histogram (bucket counts over SIGNED_BUCKETS, then the sum) -> tag, stats prefix."""
RUN_KEYS = ("updates", "wall_seconds", "env_steps")
_UNSAFE = re.compile(r"[^-/\w.]")


def tag_of(key: str) -> str:
    sig = signal_of(key)
    if sig is not None:
        group = group_of(sig.metric.name)
    else:
        group = "run" if key in RUN_KEYS else "other"
    return _UNSAFE.sub("_", f"{group.lower().replace(' ', '_')}/{key}")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class TensorBoardWriter:
    """A row observer: call it with every metrics row; close() at the end of the run."""

    def __init__(self, run_dir: str | Path, flush_secs: int = 10, start_time: float | None = None):
        self.run_dir, self.flush_secs = Path(run_dir), flush_secs
        self.writer = None
        """Opened at the first row: the run directory is the run's to create."""
        self.start_time = start_time
        """Wall-clock time of the run's start: event times become start + the row's wall_seconds."""
        self._tags: dict[str, str] = {}
        self._step = 0

    def _open(self):
        from tensorboardX import SummaryWriter
        from tensorboardX.proto.summary_pb2 import Summary

        self._summary = Summary
        self.writer = SummaryWriter(logdir=str(self.run_dir), flush_secs=self.flush_secs)

    def __call__(self, row: dict) -> None:
        if self.writer is None:
            self._open()
        step = row.get("env_steps")
        step = int(step) if _number(step) else self._step + 1
        self._step = step
        walltime = None
        if self.start_time is not None and _number(row.get("wall_seconds")):
            walltime = self.start_time + row["wall_seconds"]
        values = []
        for key, value in row.items():
            if not _number(value):
                continue
            tag = self._tags.get(key)
            if tag is None:
                tag = self._tags[key] = tag_of(key)
            values.append(self._summary.Value(tag=tag, simple_value=float(value)))
        if values:
            self.writer.file_writer.add_summary(self._summary(value=values), step, walltime)
        for key, (tag, prefix) in HISTOGRAMS.items():
            if key in row:
                self._histogram(key, tag, prefix, row, step, walltime)

    def _histogram(self, key: str, tag: str, prefix: str, row: dict, step: int, walltime: float | None) -> None:
        try:
            counts, total = row[key]
        except (TypeError, ValueError):
            return
        counts = [float(c) for c in counts]
        num = sum(counts)
        if len(counts) != len(SIGNED_BUCKETS) + 1 or num <= 0:
            return
        lo = row.get(f"{prefix}_min", SIGNED_BUCKETS[0])
        hi = row.get(f"{prefix}_max", SIGNED_BUCKETS[-1])
        mean, std = row.get(f"{prefix}_mean"), row.get(f"{prefix}_std")
        sum_squares = num * (std ** 2 + mean ** 2) if _number(mean) and _number(std) else 0.0
        limits = list(SIGNED_BUCKETS) + [max(float(hi), SIGNED_BUCKETS[-1]) * 1.0001 + 1e-9]
        self.writer.add_histogram_raw(tag, min=float(lo), max=float(hi), num=num, sum=float(total),
                                      sum_squares=sum_squares, bucket_limits=limits, bucket_counts=counts,
                                      global_step=step, walltime=walltime)

    def close(self, run_dir=None) -> None:
        """Flush and close the event file (the run loop passes the run directory; it is not needed)."""
        if self.writer is not None:
            self.writer.close()


def _start_time(run_dir: Path) -> float | None:
    import json

    try:
        started = json.loads((run_dir / "meta.json").read_text()).get("started_at")
        return time.mktime(time.strptime(started, "%Y-%m-%dT%H:%M:%S%z"))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def export_tensorboard(run_dir: str) -> tuple[Path, int]:
    """(Re)write the event files of an existing run from its metrics.jsonl; (event file, rows written).

    Event files already in the run directory (from `--tensorboard` or an earlier
    export) are replaced, so TensorBoard shows each row once.
    """
    path = check_run_dir(run_dir)
    if not (path / "metrics.jsonl").is_file():
        raise ReportError(f"RUN_DIR {run_dir!r} is invalid: it has no metrics.jsonl to export; expected a run "
                          "directory with metric rows")
    rows, _ = read_rows(path / "metrics.jsonl")
    old = sorted(path.glob(EVENT_GLOB))
    staging = path / ".tensorboard-export"
    if staging.exists():
        for stale in staging.iterdir():
            stale.unlink()
    staging.mkdir(exist_ok=True)
    try:
        writer = TensorBoardWriter(staging, flush_secs=3600, start_time=_start_time(path))
        for row in rows:
            writer(row)
        writer.close()
        (written,) = list(staging.glob(EVENT_GLOB))
        for stale in old:
            stale.unlink()
        target = path / written.name
        written.replace(target)
    finally:
        for leftover in staging.glob("*"):
            leftover.unlink()
        staging.rmdir()
    return target, len(rows)


def observers_for(cfg, run_dir) -> list:
    """The row observers a run's config asks for (the run loop hands each one every metrics row)."""
    return [TensorBoardWriter(run_dir)] if getattr(cfg, "tensorboard", False) else []
