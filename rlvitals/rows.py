"""metrics.jsonl: when a row is written, what makes it valid, and who else sees it.

Cadence (docs/architecture.md has the disk bound): a row after every update
for the first `DENSE_UPDATES` updates; after that, a row every k updates,
where k doubles each time the run's update count doubles (k = 2 for updates
1,001-2,000, 4 up to 4,000, 8 up to 8,000, ...: 500 rows per doubling); and
whatever the schedule says, a row at least every `FLOOR_SECONDS` of wall
time, so a slow late phase still reports; while no update happens because
every arriving batch is dropped, a row every `IDLE_SECONDS` (such rows repeat
the update number; their clock and drop counts advance). The update-counted rows are the
same in every repetition of a run; the time floor adds rows only after the
dense phase. The last row of a run is always written, once.

Observers: callables that receive each row (a dict, after it is on disk).
At the end of a run, whatever its status, an observer's `close(run_dir)` is
called if it has one. An observer whose own file the disk refuses (an OSError:
verdicts.json on a full disk) fails as a write of the run does: one line, the run
ends. Any other error is a bug in the observer: under pytest (or
RLVITALS_STRICT_METRICS=1) it propagates; in production it is logged with its
traceback and that observer is detached, and training goes on.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rlvitals.telemetry.invariants import BY_NAME as INVARIANTS_BY_NAME
from rlvitals.telemetry.recorder import strict_by_default

log = logging.getLogger("rlvitals.rows")

DENSE_UPDATES = 1000
"""Updates at the start of a run that each get a row."""
FLOOR_SECONDS = 60.0
"""Longest wall time between two rows once the schedule thins them."""

IDLE_SECONDS = 5.0
"""Row interval while updates stall because every arriving batch is dropped: alerts need rows to fire."""

MEASURED_KEYS = ("wall_seconds", "rss_bytes", "inv_memory_per_sample", "inv_learner_waits_while_ready",
                 "actor_inference_cost_ratio", "actor_env_step_cost_ratio", "learner_minibatch_cost_ratio")
"""Row keys read from the machine (clock, memory and memory's growth per sample, the learner's needless waits,
each phase's cost against its reference: rlvitals/costs.py): different in every repetition of a run."""

MODE_KEYS = ("inv_actor_accounting", INVARIANTS_BY_NAME["memory_per_sample"].names_key,
             "inv_weight_loads_per_published_version")
"""Row keys only one mode writes (the Ray actors' own counters and weight loads; which process's memory grows, by
pid): a Ray run replaying local mode has them besides."""

RowObserver = Callable[[dict], None]


def scheduled(updates: int, dense: int = DENSE_UPDATES) -> bool:
    """Whether the update-counted schedule writes a row after update number `updates` (1-based)."""
    if updates <= dense:
        return True
    every = 1 << ((updates - 1) // dense).bit_length()  # (dense*2^j, dense*2^(j+1)] -> 2^(j+1)
    return updates % every == 0


def clean_row(row: dict) -> dict:
    """Only defined values: None and non-finite floats are left out, never written as 0."""
    return {k: v for k, v in row.items()
            if v is not None and not (isinstance(v, float) and not math.isfinite(v))}


class RowWriter:
    """Appends rows to the run archive on the cadence above and hands each to the observers."""

    def __init__(self, archive, observers: Iterable[RowObserver] = (), dense: int = DENSE_UPDATES,
                 floor_seconds: float = FLOOR_SECONDS, strict: bool | None = None):
        self.archive = archive
        self.observers = list(observers)
        self.dense, self.floor_seconds = dense, floor_seconds
        self.strict = strict_by_default() if strict is None else strict
        self.last_updates: int | None = None
        self.last_dropped_stale: int | None = None
        self.last_time = time.perf_counter()

    def due(self, updates: int) -> bool:
        return scheduled(updates, self.dense) or time.perf_counter() - self.last_time >= self.floor_seconds

    def idle_due(self) -> bool:
        """While no update happens (every batch dropped), whether a row is due: every `IDLE_SECONDS`."""
        return time.perf_counter() - self.last_time >= IDLE_SECONDS

    def write(self, row: dict) -> dict:
        row = clean_row(row)
        self.archive.append_metrics(row)
        self.last_updates = row.get("updates")
        self.last_dropped_stale = row.get("dropped_stale")
        self.last_time = time.perf_counter()
        for observer in list(self.observers):
            if not self._call(observer, row):
                self.observers.remove(observer)
        return row

    def close(self, run_dir: Path) -> None:
        """Tell every observer the run has ended (its rows are all written)."""
        for observer in self.observers:
            close = getattr(observer, "close", None)
            if callable(close):
                self._call(close, Path(run_dir))

    def _call(self, fn, arg) -> bool:
        from .archive import ArchiveWriteError

        try:
            fn(arg)
            return True
        except ArchiveWriteError:  # the run directory is full, not a bug of the observer: the run ends on it
            raise
        except OSError as exc:  # the disk refused the observer's own file (verdicts.json): the same, not a bug
            self._refused(fn, exc)
            return False
        except Exception:
            if self.strict:
                raise
            log.exception("row observer %r failed; it is detached, training goes on", fn)
            return False

    def _refused(self, fn, exc: OSError) -> None:
        """A write of an observer's own file failed: the run's first write failure (raised, once), or one more
        file the ending run could not write (named in that failure's line)."""
        from .archive import ArchiveWriteError

        name = Path(exc.filename).name.strip(".").removesuffix(".tmp") if exc.filename else \
            f"the file of {getattr(fn, '__qualname__', fn)}"
        if self.archive.write_error is not None:
            self.archive.not_written.append(name)
            return
        path = Path(exc.filename) if exc.filename else self.archive.path
        self.archive.record_failure(ArchiveWriteError(path, None, exc, kept=f"{name} not written"))
