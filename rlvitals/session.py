"""One training session of the `rlvitals train` command: archive, telemetry, SIGTERM/SIGINT, then the run.

Also where a run is dispatched to its mode's loop (`train`, `train_in` for tools and tests): the loops
(rlvitals/training.py, rlvitals/distributed/loops.py) build on rlvitals/run.py, and nothing there imports
this module back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from .archive import ArchiveWriteError, RunArchive
from .checkpoint import telemetry_state
from .config import TrainConfig
from .rows import RowObserver
from .run import run_info
from .status import ended_by


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


@contextlib.contextmanager
def open_archive(cfg: TrainConfig, argv: list[str], resume: dict | None = None):
    """The run directory, new (or, resuming, the existing one with the resume noted); closed at the end."""
    if resume is None:
        archive = RunArchive.create(cfg.run_dir, cfg.to_dict(), argv)
    else:
        archive = RunArchive(cfg.run_dir)
        archive.note_resume(argv, resume["tracker"]["env_steps"], cfg.to_dict(), updates=resume["tracker"]["updates"],
                            best=resume.get("best"))
    try:
        yield archive
    except BaseException as exc:
        if not (archive.summary_written or archive.summary_failed):  # ended before the run loop wrote one
            with contextlib.suppress(ArchiveWriteError):
                archive.write_summary(ended_by(exc))
        raise
    finally:
        archive.close()


def start_run_telemetry(cfg: TrainConfig, archive: RunArchive, resume: dict | None = None):
    """This process's telemetry (no-op at `off`), counters loaded from `resume` before it first answers."""
    from rlvitals.telemetry.process import start_telemetry

    host = cfg.metrics_host
    if host == "node":  # the address other machines reach this one at
        import socket

        host = socket.gethostbyname(socket.gethostname())
    return start_telemetry(
        "local" if cfg.mode == "local" else "learner", cfg.verbosity, host=host, port=cfg.metrics_port,
        discovery_dir=str(archive.path / "discovery"), run_info=run_info(cfg, archive),
        state=telemetry_state(resume) if resume is not None else None)


def train(cfg: TrainConfig, archive: RunArchive, telemetry=None, stop=None, resume: dict | None = None,
          observers: Iterable[RowObserver] = ()) -> dict:
    """Train in the mode the config names; the run summary."""
    if cfg.mode == "local":
        from .training import train_local

        return train_local(cfg, archive, telemetry, stop=stop, resume=resume, observers=observers)
    from .distributed import train_ray

    return train_ray(cfg, archive, telemetry, stop=stop, resume=resume, observers=observers)


def train_in(cfg: TrainConfig, argv: list[str], telemetry=None, stop=None,
             observers: Iterable[RowObserver] = (), serve_metrics: bool = False) -> tuple[dict, Path]:
    """A fresh run directory, a run in it, the directory closed: (summary, run dir). For tools and tests.

    `serve_metrics`: start the run's telemetry as `rlvitals train` does (its endpoint and discovery file)."""
    with open_archive(cfg, argv) as archive:
        if serve_metrics:
            telemetry = start_run_telemetry(cfg, archive)
        try:
            return train(cfg, archive, telemetry, stop=stop, observers=observers), archive.path
        finally:
            if serve_metrics:
                telemetry.stop()
