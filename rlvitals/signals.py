"""How a training run stops on SIGTERM and SIGINT.

The first signal asks for a graceful stop: the run loop sees `stop()` turn
true after its current update, writes its final checkpoint, last metrics row
and summary.json (status `terminated` for SIGTERM, `interrupted` for SIGINT),
and ends.

The run ends at once instead (RunStopped is raised where the main thread is,
and the run loop's handler writes the archive) when
  * a second signal arrives before the loop has taken the first, or
  * after the first signal, the main thread stays blocked inside one env step
    for more than `grace` seconds (the graceful stop is only looked at between
    updates, so a hung env would otherwise hold the run for ever).
If even that cannot reach the main thread (an env step stuck in C code that
never returns), the process exits `hard` seconds later with one line saying
so; the last checkpoint on disk stays as it was.

Once the loop has taken the stop (it is writing the archive), further signals
are noted and ignored, so a repeated Ctrl-C cannot tear the final checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}
STATUS = {signal.SIGTERM: "terminated", signal.SIGINT: "interrupted"}
EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}


class RunStopped(BaseException):
    """The run was stopped at once by a signal (not an Exception: nothing on the way may swallow it)."""

    def __init__(self, signum: int, reason: str):
        super().__init__(reason)
        self.signum, self.reason = signum, reason

    @property
    def status(self) -> str:
        return STATUS[self.signum]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.signum]


def env_step_seconds() -> float:
    """How long the env step now in progress in this process has taken (0 when none is)."""
    runner = sys.modules.get("rlvitals.actors.runner")
    return runner.env_step_seconds() if runner is not None else 0.0


class StopRequests:
    """The run loop's `stop()`, fed by SIGTERM and SIGINT; see the module docstring."""

    def __init__(self, grace: float = 5.0, hard: float = 30.0, blocked=env_step_seconds, stream=None):
        self.grace, self.hard = grace, hard
        self.blocked = blocked
        self.stream = stream
        self.signum: int | None = None
        self.taken = False       # the loop saw the stop and is writing the archive
        self.raised = False      # RunStopped was raised (once at most)
        self._force = ""
        self._kick = False
        self._main = threading.main_thread().ident
        self._done = threading.Event()
        self._noted = False

    # ---- what the run loop sees
    def __call__(self) -> bool:
        if self.signum is None:
            return False
        self.taken = True
        return True

    @property
    def status(self) -> str | None:
        """`terminated` or `interrupted` once a signal asked the run to stop, else None."""
        return STATUS.get(self.signum) if self.signum is not None else None

    # ---- the signal handler (runs in the main thread)
    def handle(self, signum: int, frame) -> None:
        if self._kick:  # the watchdog's signal: stop at once if the main thread is still inside the env step
            self._kick = False
            if not (self.taken or self.raised) and self.blocked() > 0:
                self.raised = True
                raise RunStopped(self.signum, self._force)
            return
        if self.raised or self.taken:
            if not self._noted:
                self._noted = True
                self._say(f"{NAMES.get(signum, signum)} received: already stopping, writing the run archive")
            return
        if self.signum is None:
            self.signum = signum
            self._say(f"{NAMES.get(signum, signum)} received: stopping after this update (again to stop at once)")
            threading.Thread(target=self._watch, name="rlvitals-stop-watchdog", daemon=True).start()
            return
        self.raised = True
        raise RunStopped(self.signum, f"second {NAMES.get(signum, signum)}")

    # ---- the watchdog: a graceful stop that an env step blocks
    def _watch(self) -> None:
        while not self._done.wait(0.2):
            if self.taken or self.raised:
                return
            stuck = self.blocked()
            if stuck > self.grace:
                self._force = f"env step blocked for {stuck:.0f} s"
                self._kick = True
                signal.pthread_kill(self._main, self.signum)
                break
        while not self._done.wait(0.5):  # the main thread got the signal unless the step never returns
            stuck = self.blocked()
            if stuck == 0.0 or self.taken:
                return  # the step returned: the run loop writes the archive
            if stuck > self.grace + self.hard:
                self._say(f"the env step has been blocked for {stuck:.0f} s and does not return; exiting "
                          "without writing the run archive (its last checkpoint stays as it was)")
                os._exit(EXIT_CODES.get(self.signum, 1))

    def close(self) -> None:
        self._done.set()

    def _say(self, text: str) -> None:
        from .progress import break_line

        print(f"{break_line()}rlvitals: {text}", file=self.stream or sys.stderr, flush=True)


@contextlib.contextmanager
def stop_requests(grace: float = 5.0, hard: float = 30.0):
    """SIGTERM and SIGINT handled as the module docstring says while the block runs; yields `stop()`."""
    requests = StopRequests(grace, hard)
    previous = {s: signal.signal(s, requests.handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield requests
    finally:
        requests.close()
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def signals_raise():
    """SIGTERM and SIGINT raise RunStopped in the main thread while the block runs, so that its cleanups (finally
    blocks: a staging folder removed) run before the process ends, where the default action would kill it at once."""
    def handle(signum: int, frame) -> None:
        raise RunStopped(signum, NAMES[signum])

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def report_stop(summary: dict) -> int:
    """The exit code of a run that ended with `summary`; a stopped run also gets one line on stderr."""
    status = summary.get("status")
    if status not in ("terminated", "interrupted"):
        return 0
    from .archive import last_archive

    archive = last_archive()
    said = archive.outcome() if archive is not None else "no run directory was written"
    print(f"rlvitals: {status} after update {summary.get('updates', 0)}: {said}", file=sys.stderr, flush=True)
    return 0 if status == "terminated" else EXIT_CODES[signal.SIGINT]


def report_abort(exc: BaseException) -> int:
    """One line for a run ended at once (RunStopped) or by a KeyboardInterrupt outside the run loop; exit code."""
    from .archive import last_archive

    archive = last_archive()
    said = archive.outcome() if archive is not None else "no run directory was written"
    if isinstance(exc, RunStopped):
        print(f"rlvitals: {exc.status} ({exc.reason}): {said}", file=sys.stderr, flush=True)
        return exc.exit_code
    print(f"rlvitals: interrupted: {said}", file=sys.stderr, flush=True)
    return EXIT_CODES[signal.SIGINT]
