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

import contextlib
import errno
import fnmatch
import math
import os
import re
import tempfile
import time
from pathlib import Path

from rlvitals.telemetry.catalogue import SIGNED_BUCKETS
from rlvitals.telemetry.health import RowTally, usable_number

from ..archive.files import file_mode
from .rundata import ReportError, check_run_dir, stream_rows
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
    return isinstance(v, (int, float)) and not isinstance(v, bool) and usable_number(v)


class TensorBoardWriter:
    """A row observer: call it with every metrics row; close() at the end of the run.

    Events go to one new event file in `run_dir` (events.EventFile: written in this thread, never through a
    link, with the run directory's file mode). A write that fails raises ArchiveWriteError, through the run's
    archive when it is this run directory's, so a full disk ends the run in the same one line as any other
    write of the run."""

    def __init__(self, run_dir: str | Path, flush_secs: int = 10, start_time: float | None = None,
                 mode: int | None = None):
        self.run_dir, self.flush_secs, self.mode = Path(run_dir), flush_secs, mode
        self.writer = None
        """Opened at the first row: the run directory is the run's to create."""
        self.start_time = start_time
        """Wall-clock time of the run's start: event times become start + the row's wall_seconds."""
        self._tags: dict[str, str] = {}
        self._step = 0
        self._flushed = time.monotonic()
        self.rows = 0
        self.path: Path | None = None
        """The event file, once the first row opened it."""
        self._written = 0  # bytes of the event file once closed

    def __call__(self, row: dict) -> None:
        try:
            if self.writer is None:
                from .events import EventFile

                self.writer = EventFile(self.run_dir, file_mode(self.run_dir) if self.mode is None else self.mode)
                self.path = self.writer.path
            self._write(row)
            if time.monotonic() - self._flushed >= self.flush_secs:
                self.writer.flush()
                self._flushed = time.monotonic()
        except OSError as exc:
            self._failed(exc)
        self.rows += 1

    def _write(self, row: dict) -> None:
        from tensorboardX.proto.summary_pb2 import Summary

        step = row.get("env_steps")
        step = int(step) if _number(step) and abs(step) < 2**63 else self._step + 1
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
            values.append(Summary.Value(tag=tag, simple_value=float(value)))
        if values:
            self.writer.add_summary(Summary(value=values), step, walltime)
        for key, (tag, prefix) in HISTOGRAMS.items():
            if key in row:
                self._histogram(key, tag, prefix, row, step, walltime)

    def _histogram(self, key: str, tag: str, prefix: str, row: dict, step: int, walltime: float | None) -> None:
        from tensorboardX.summary import histogram_raw

        try:
            counts, total = row[key]
            counts = [float(c) for c in counts]
            total = float(total)
        except (TypeError, ValueError, OverflowError):  # not the (counts, sum) pair a learner row holds
            return
        num = sum(counts)
        if len(counts) != len(SIGNED_BUCKETS) + 1 or not num > 0 or not math.isfinite(num + total):
            return
        lo, hi = row.get(f"{prefix}_min", SIGNED_BUCKETS[0]), row.get(f"{prefix}_max", SIGNED_BUCKETS[-1])
        if not (_number(lo) and _number(hi)):
            lo, hi = SIGNED_BUCKETS[0], SIGNED_BUCKETS[-1]
        mean, std = row.get(f"{prefix}_mean"), row.get(f"{prefix}_std")
        sum_squares = num * (std ** 2 + mean ** 2) if _number(mean) and _number(std) else 0.0
        limits = list(SIGNED_BUCKETS) + [max(float(hi), SIGNED_BUCKETS[-1]) * 1.0001 + 1e-9]
        summary = histogram_raw(tag, min=float(lo), max=float(hi), num=num, sum=total, sum_squares=sum_squares,
                                bucket_limits=limits, bucket_counts=counts)
        self.writer.add_summary(summary, step, walltime)

    def _failed(self, exc: OSError) -> None:
        """ArchiveWriteError for a failed write; the run's archive (when it is this directory's) records it."""
        from rlvitals.archive import ArchiveWriteError, last_archive

        path = self.path or self.run_dir / "events.out.tfevents.*"
        error = ArchiveWriteError(path, self.bytes_written, exc, kept="the events written before it kept")
        archive = last_archive()
        if archive is not None and archive.path.resolve() == self.run_dir.resolve():
            archive.record_failure(error)  # raises it, once; a later failure, while the run ends, is noted
            return
        raise error

    @property
    def bytes_written(self) -> int:
        return self._written + (self.writer.bytes_written if self.writer is not None else 0)

    def close(self, run_dir=None) -> None:
        """Flush and close the event file (the run loop passes the run directory; it is not needed)."""
        if self.writer is not None:
            writer, self.writer = self.writer, None
            self._written = writer.bytes_written
            try:
                writer.close()
            except OSError as exc:
                self._failed(exc)

    def abandon(self) -> None:
        """Close the event file whatever state it is in (a failed export removes it): a failing close is no news."""
        from rlvitals.archive import ArchiveWriteError

        with contextlib.suppress(OSError, ArchiveWriteError):
            self.close()


def _start_time(run_dir: Path) -> float | None:
    import json

    from ..limits import JSON_BYTES_MAX, read_bounded

    try:
        started = json.loads(read_bounded(run_dir / "meta.json", JSON_BYTES_MAX, "meta.json")).get("started_at")
        return time.mktime(time.strptime(started, "%Y-%m-%dT%H:%M:%S%z"))
    except (OSError, ValueError, TypeError, AttributeError, RecursionError, OverflowError):
        return None


STAGING = ".tensorboard-export"
"""Prefix of the folder an export writes into before its file replaces the run's event files."""


def export_tensorboard(run_dir: str) -> tuple[Path, int]:
    """(Re)write the event files of an existing run from its metrics.jsonl; (event file, rows written).

    Event files already in the run directory (from `--tensorboard` or an earlier
    export) are replaced, so TensorBoard shows each row once. The run directory may come
    from anyone: nothing in it is written or deleted through a link, what is not an
    event file is refused in one line (ReportError) before anything is written, and a
    failed write (ArchiveWriteError) leaves the run's files as they were.
    """
    from rlvitals.archive.lock import LOCK_NAME, lock_run_dir

    path = check_run_dir(run_dir)
    metrics = path / "metrics.jsonl"
    if not os.path.lexists(metrics):
        raise ReportError(f"RUN_DIR {run_dir!r} is invalid: it has no metrics.jsonl to export; expected a run "
                          "directory with metric rows")
    lock = None
    if os.path.lexists(path / LOCK_NAME):  # a run made without one (older, or a copy) has no writer to wait for
        try:
            lock = lock_run_dir(path, write_pid=False)  # no run writes it meanwhile: its live event file would go
        except OSError as exc:
            raise _unwritable(path, run_dir, exc) from None
    try:
        old = _event_files(path, run_dir)
        _remove_stale_staging(path)
        staging = Path(_staging(path, run_dir))
        try:
            target, rows = _write_events(path, staging, metrics, run_dir)
            for stale in old:
                if stale != target:
                    stale.unlink(missing_ok=True)  # unlink removes a name, never what a link points to
        finally:
            _remove_stale_staging(path, staging.name)
    finally:
        if lock is not None:
            os.close(lock)
    return target, rows


def _event_files(path: Path, run_dir: str) -> list[Path]:
    """The run's event files, each a plain file; ReportError naming the first that is a link or a folder."""
    found = []
    for entry in os.scandir(path):
        if fnmatch.fnmatch(entry.name, EVENT_GLOB):
            if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                kind = "a symbolic link" if entry.is_symlink() else "not a regular file"
                raise ReportError(f"RUN_DIR {run_dir!r} is invalid: {entry.name} is {kind}; expected event files "
                                  "that are plain files (links in a run directory are never followed)")
            found.append(Path(entry.path))
    return sorted(found)


def _staging(path: Path, run_dir: str) -> str:
    try:
        return tempfile.mkdtemp(prefix=f"{STAGING}-", dir=path)  # new, ours, 0700: nothing planted in it
    except OSError as exc:
        raise _unwritable(path, run_dir, exc) from None


def _unwritable(path: Path, run_dir: str, exc: OSError) -> Exception:
    """ReportError for a run directory nothing may be written into; ArchiveWriteError for one that is full."""
    from rlvitals.archive import ArchiveWriteError

    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ReportError(f"RUN_DIR {run_dir!r} is not writable ({exc.strerror}); expected a run directory the "
                           "export can write its event file into")
    return ArchiveWriteError(path / f"{STAGING}-*", 0, exc, kept="nothing written")


def _write_events(path: Path, staging: Path, metrics: Path, run_dir: str) -> tuple[Path, int]:
    """Every row of metrics.jsonl into one event file in `staging`, then renamed into the run directory."""
    from rlvitals.archive import ArchiveWriteError
    from rlvitals.archive.files import file_mode, fsync_folder

    writer = TensorBoardWriter(staging, flush_secs=3600, start_time=_start_time(path), mode=file_mode(path))
    try:
        for row in stream_rows(metrics, RowTally()):
            writer(row)
        writer.close()
    except ArchiveWriteError as exc:  # the staging folder goes with what was written: say so, of the file meant
        raise ArchiveWriteError(path / exc.path.name, exc.size, exc.error,
                                kept="the partial export removed, the run's files as they were") from None
    except OSError as exc:  # metrics.jsonl unreadable, or no regular file
        raise ReportError(f"RUN_DIR {run_dir!r} is invalid: its metrics.jsonl cannot be read "
                          f"({exc.strerror or exc}); expected a regular file of JSON rows") from None
    finally:
        writer.abandon()  # closed already, unless a write or a read failed
    if writer.path is None:
        raise ReportError(f"RUN_DIR {run_dir!r} has no metrics rows yet: nothing to export; expected a run that "
                          "has written at least one row")
    target = path / writer.path.name
    try:
        os.replace(writer.path, target)
        fsync_folder(path)
    except OSError as exc:
        raise ArchiveWriteError(target, writer.bytes_written, exc, kept="the run's event files kept") from None
    return target, writer.rows


def _remove_stale_staging(path: Path, only: str | None = None) -> None:
    """Staging folders an export left (killed mid-way): their files go, links as links; a folder that is a link,
    or anything else inside, is left alone."""
    for entry in os.scandir(path):
        if not entry.name.startswith(STAGING) or (only is not None and entry.name != only):
            continue
        if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            continue
        for inner in os.scandir(entry.path):
            if inner.is_symlink() or inner.is_file(follow_symlinks=False):
                os.unlink(inner.path)
        with contextlib.suppress(OSError):  # not empty: something that is not ours stays
            os.rmdir(entry.path)


def observers_for(cfg, run_dir) -> list:
    """The row observers a run's config asks for (the run loop hands each one every metrics row)."""
    return [TensorBoardWriter(run_dir)] if getattr(cfg, "tensorboard", False) else []
