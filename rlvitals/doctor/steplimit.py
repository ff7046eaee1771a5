"""The env check's per-step time limit (`rlvitals doctor --env ... --step-timeout S`).

An env step that blocks (a socket that never answers, a lock, a sleep) would hold the doctor for ever and
say nothing. While `step_limit` is active a watchdog thread reads how long the env step in progress has
taken (rlvitals.signals.env_step_seconds); past the limit it interrupts the main thread with SIGALRM, whose
handler raises StepBlocked out of the step, and the check reports the env as blocked. A step stuck in C
code that never returns to Python cannot be interrupted: after as long again, `on_stuck` is called (it
reports the finding and ends the process).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable

from ..signals import env_step_seconds

DEFAULT_STEP_TIMEOUT = 30.0
"""Seconds one env step may take in the env check before it counts as blocked."""


class StepBlocked(BaseException):
    """The env step in progress blocked past the limit. Not an Exception: the runner's `except Exception`,
    which turns an env's own errors into EnvStepError, must let it through."""

    def __init__(self, seconds: float):
        super().__init__(f"env step blocked for {seconds:.0f} s")
        self.seconds = seconds


class _Watchdog:
    def __init__(self, limit: float, on_stuck: Callable[[float], None], blocked: Callable[[], float]):
        self.limit, self.on_stuck, self.blocked = limit, on_stuck, blocked
        self.main = threading.main_thread().ident
        self.done = threading.Event()
        self.kicked = False

    def handle(self, signum: int, frame) -> None:
        stuck = self.blocked()
        if self.kicked and stuck > 0:  # still inside the step that was found blocked
            self.kicked = False
            raise StepBlocked(stuck)

    def watch(self) -> None:
        poll = min(0.1, self.limit / 4)
        while not self.done.wait(poll):
            stuck = self.blocked()
            if stuck <= self.limit:
                continue
            self.kicked = True
            signal.pthread_kill(self.main, signal.SIGALRM)
            while not self.done.wait(poll):  # the handler ends the step, unless it never returns to Python
                now = self.blocked()
                if now == 0.0 or now < stuck:
                    break  # that step ended (interrupted); the next one is watched afresh
                if now > 2 * self.limit:
                    self.on_stuck(now)
                    return


@contextlib.contextmanager
def step_limit(limit: float, on_stuck: Callable[[float], None], blocked: Callable[[], float] = env_step_seconds):
    """While the block runs, an env step of the main thread blocked more than `limit` seconds raises StepBlocked
    there. Only the main thread gets signals: elsewhere the block runs without a limit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    dog = _Watchdog(limit, on_stuck, blocked)
    previous = signal.signal(signal.SIGALRM, dog.handle)
    thread = threading.Thread(target=dog.watch, name="rlvitals-step-limit", daemon=True)
    thread.start()
    try:
        yield
    finally:
        dog.done.set()
        thread.join()
        signal.signal(signal.SIGALRM, previous)
