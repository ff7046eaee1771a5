"""One training session: archive, telemetry, signals, then the chosen run loop."""

from __future__ import annotations

import signal

from .archive import RunArchive
from .checkpoint import restore_counters
from .config import TrainConfig


def run_training(cfg: TrainConfig, argv: list[str], resume: dict | None = None) -> dict:
    """Create (or, resuming, reopen) the run directory, start telemetry, train, and always clean up."""
    if resume is None:
        archive = RunArchive.create(cfg.run_dir, cfg.to_dict(), argv)
    else:
        archive = RunArchive(cfg.run_dir)
        archive.note_resume(argv, resume["tracker"]["env_steps"], cfg.to_dict())
    telemetry = None
    if cfg.verbosity != "off":
        from rlvitals.telemetry.process import ProcessTelemetry

        meta = archive.meta
        host = cfg.metrics_host
        if host == "node":  # the address other machines reach this one at
            import socket

            host = socket.gethostbyname(socket.gethostname())
        telemetry = ProcessTelemetry.start(
            restore=(lambda t: restore_counters(t, resume)) if resume is not None else None,
            component="local" if cfg.mode == "local" else "learner", verbosity=cfg.verbosity, host=host,
            port=cfg.metrics_port,
            discovery_dir=str(archive.path / "discovery"),
            run_info={"run_id": meta["run_id"], "env": cfg.env, "algorithm": cfg.agent,
                      "mode": cfg.mode, "code_version": meta["code_version"]["commit"][:12]})
        if cfg.progress:
            print(f"rlvitals: metrics at {telemetry.url}  (run dir {archive.path})", flush=True)
    stopping = {"flag": False}

    def on_term(signum, frame):  # SIGTERM: finish the current update, then write the archive
        stopping["flag"] = True

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        if cfg.mode == "local":
            from .training import train_local

            return train_local(cfg, archive, telemetry, stop=lambda: stopping["flag"], resume=resume)
        from .distributed import train_ray

        return train_ray(cfg, archive, telemetry, stop=lambda: stopping["flag"], resume=resume)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if telemetry is not None:
            telemetry.stop()
        archive.close()
