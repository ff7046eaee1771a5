"""One training session of the `rlvitals train` command: archive, telemetry, SIGTERM, then the run."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable

from .config import TrainConfig
from .rows import RowObserver
from .run import open_archive, start_run_telemetry, train


@contextlib.contextmanager
def stop_on_sigterm():
    """A `stop()` that turns True once SIGTERM arrives: the run finishes its update and writes its archive."""
    requested = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: requested.append(signum))
    try:
        yield lambda: bool(requested)
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_training(cfg: TrainConfig, argv: list[str], resume: dict | None = None,
                 observers: Iterable[RowObserver] = ()) -> dict:
    """Create (or, resuming, reopen) the run directory, start telemetry, train, and always clean up."""
    with open_archive(cfg, argv, resume) as archive:
        telemetry = start_run_telemetry(cfg, archive, resume)
        try:
            if cfg.progress and telemetry.url:
                print(f"rlvitals: metrics at {telemetry.url}  (run dir {archive.path})", flush=True)
            with stop_on_sigterm() as stop:
                return train(cfg, archive, telemetry, stop=stop, resume=resume, observers=observers)
        finally:
            telemetry.stop()
