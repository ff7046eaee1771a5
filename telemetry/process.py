"""A process's telemetry endpoint: registry, /metrics server and file_sd discovery file.

`start_telemetry` is how a process gets its telemetry: a served
`ProcessTelemetry`, or the no-op one at verbosity `off`.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import stat
from pathlib import Path

from prometheus_client import CollectorRegistry

from .collectors import CatalogueCollector, SystemCollector
from .interface import NULL_TELEMETRY, RecorderTelemetry
from .recorder import Recorder
from .server import MetricsServer, start_metrics_server  # noqa: F401  (re-exported)


def build_registry(recorder: Recorder, extra_labels: dict[str, str] | None = None) -> CollectorRegistry:
    """A fresh registry holding only rlvitals collectors (no default process/GC collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CatalogueCollector(recorder, extra_labels))
    registry.register(SystemCollector(recorder, extra_labels))
    return registry


class ProcessTelemetry(RecorderTelemetry):
    """The telemetry interface over a Recorder, served on /metrics, with a file_sd discovery file.

    The HTTP server runs in its own daemon thread, so scrapes never run inside
    the training loop.
    """

    def __init__(self, recorder: Recorder, registry: CollectorRegistry, server, thread, url: str,
                 target_file: Path | None):
        super().__init__(recorder)
        self.registry = registry
        self._server, self._thread = server, thread
        self.url = url
        self.target_file = target_file
        self.port = server.server_address[1]

    @classmethod
    def start(cls, component: str, verbosity: str, host: str = "127.0.0.1", port: int = 0,
              discovery_dir: str | None = None, run_info: dict | None = None,
              extra_labels: dict[str, str] | None = None, target_labels: dict[str, str] | None = None,
              state: dict | None = None) -> ProcessTelemetry:
        """Start serving. `state` (of an earlier `state()`) is loaded before the first scrape can be answered."""
        recorder = Recorder(verbosity, component)
        recorder.set_info(**(run_info or {}))
        registry = build_registry(recorder, extra_labels)
        if state:
            recorder.load_state(state)
        server, thread = start_metrics_server(host, port, registry)
        bound = server.server_address[1]
        shown = host if host not in ("0.0.0.0", "::") else socket.gethostname()
        url = f"http://{shown}:{bound}/metrics"
        target_file = None
        if discovery_dir:
            labels = {"component": component, **(target_labels or {}), **run_target_labels(run_info or {})}
            target_file = write_target(discovery_dir, f"{component}-{os.getpid()}-{bound}",
                                       f"{shown}:{bound}", labels)
        telemetry = cls(recorder, registry, server, thread, url, target_file)
        atexit.register(telemetry.stop)
        return telemetry

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.target_file is not None:
            try:
                self.target_file.unlink()
            except FileNotFoundError:
                pass
            self.target_file = None


TARGET_IDENTITY = ("run_id", "run_name")
"""The run-identity labels Prometheus attaches to every series of a process (from its discovery file), so any
query can select or name a run; one value each per run, so they never multiply series."""


def run_target_labels(run_info: dict) -> dict[str, str]:
    """The discovery-file labels naming a process's run (those of TARGET_IDENTITY it knows)."""
    return {k: str(run_info[k]) for k in TARGET_IDENTITY if k in run_info}


def start_telemetry(component: str, verbosity: str, **kwargs):
    """ProcessTelemetry.start at any level but `off`, where it is the no-op telemetry (nothing served)."""
    if verbosity == "off":
        return NULL_TELEMETRY
    return ProcessTelemetry.start(component, verbosity, **kwargs)


def write_target(directory: str, name: str, address: str, labels: dict[str, str]) -> Path:
    """Write a Prometheus file_sd target file atomically (Prometheus may read it at any moment).

    The folder, when made here, takes its parent's mode and the file its folder's read and write bits, so an
    owner-only run directory gets owner-only discovery files (Prometheus started by the same user reads them).
    """
    path = Path(directory)
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=stat.S_IMODE(path.parent.stat().st_mode), exist_ok=True)
    target = path / f"{name}.json"
    tmp = path / f".{name}.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, stat.S_IMODE(path.stat().st_mode) & 0o666)
    with open(fd, "w") as fh:
        fh.write(json.dumps([{"targets": [address], "labels": labels}]))
    os.replace(tmp, target)
    return target
