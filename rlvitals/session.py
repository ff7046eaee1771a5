"""One training session of the `rlvitals train` command: archive, telemetry, SIGTERM/SIGINT, then the run."""

from __future__ import annotations

from collections.abc import Iterable

from .config import TrainConfig
from .rows import RowObserver
from .run import open_archive, start_run_telemetry, train


def stop_on_sigterm():
    """SIGTERM and SIGINT stop the run (rlvitals/signals.py): the first after its update, a second one, or
    an env step that blocks the first, at once; the run archive is written either way.

    Only the main thread receives signals: a run started in another thread (`rlvitals.train` called from
    a worker thread) runs to its end with no stop().
    """
    import contextlib
    import threading

    from .signals import stop_requests

    if threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext(None)
    return stop_requests()


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
