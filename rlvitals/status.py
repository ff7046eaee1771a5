"""A run's status: one word, the same in summary.json, `rlvitals runs` and the report.

How a run ended, written into summary.json by the run itself:
  completed    it took its env steps (or reached its return threshold with `stop_at_threshold`)
  interrupted  SIGINT / Ctrl-C
  terminated   SIGTERM
  failed       an exception ended it; summary.json's `cause` says which, in one line

What a reader adds for a run without an end written, or one that is being written again (a resume):
  running      a live process holds the run directory's lock (rlvitals/archive/lock.py)
  crashed      no summary.json and no live writer: killed (SIGKILL, out of memory, power) before it could write one

Liveness is the lock, not a pid: the kernel drops a `flock` when its process ends however it ends, so a pid
that was reused by another process since is never taken for the run, and a lock on a shared file system is
seen from other hosts too.
"""

from __future__ import annotations

from pathlib import Path

COMPLETED, INTERRUPTED, TERMINATED, FAILED = "completed", "interrupted", "terminated", "failed"
RUNNING, CRASHED = "running", "crashed"
ENDINGS = (COMPLETED, INTERRUPTED, TERMINATED, FAILED)
"""The statuses a run writes into its summary.json."""

CAUSE_LIMIT = 300
"""Characters of a failed run's `cause` at most: a line for a table, not the traceback."""


def one_line_cause(exc: BaseException) -> str:
    """`ExceptionClass: message` on one line, cut to CAUSE_LIMIT characters."""
    text = " ".join(str(exc).split())
    cause = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return cause if len(cause) <= CAUSE_LIMIT else cause[: CAUSE_LIMIT - 3] + "..."


def ended_by(exc: BaseException) -> dict:
    """The summary.json fields of a run that an exception ended: its status and, for a failure, the cause."""
    status = getattr(exc, "status", None)  # RunStopped (rlvitals/signals.py) names the signal's status
    if status in (INTERRUPTED, TERMINATED):
        return {"status": status}
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C where no signal handler was installed
        return {"status": INTERRUPTED}
    return {"status": FAILED, "cause": one_line_cause(exc)}


def recorded_status(summary: dict) -> str:
    """The status a summary.json records, in today's words.

    Runs written before these words: no status at all was a completed run, an exception's class name
    was the status (`KeyboardInterrupt` for Ctrl-C, anything else a failure)."""
    status = summary.get("status", COMPLETED)
    if status in ENDINGS:
        return status
    return INTERRUPTED if status == "KeyboardInterrupt" else FAILED


def recorded_cause(summary: dict) -> str | None:
    """A failed run's one-line cause (an older summary's status, the class name, where it has no `cause`)."""
    if recorded_status(summary) != FAILED:
        return None
    return summary.get("cause") or (str(summary["status"]) if summary.get("status") != FAILED else None)


def status_and_cause(run_dir: str | Path, summary: dict | None) -> tuple[str, str | None]:
    """`run_status` and, for a failed run, its one-line cause (else None)."""
    status = run_status(run_dir, summary)
    return status, (recorded_cause(summary) if status == FAILED and summary else None)


def run_status(run_dir: str | Path, summary: dict | None) -> str:
    """The status of the run in `run_dir`, whose summary.json holds `summary` (None or {}: none there).

    A live writer comes first: a resumed run is running although the summary of its previous end is still there.
    """
    from .archive.lock import held_by_live_process

    if held_by_live_process(Path(run_dir)):
        return RUNNING
    if not summary:
        return CRASHED
    return recorded_status(summary)
