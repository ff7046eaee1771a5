"""A process's telemetry endpoint: registry, /metrics server and file_sd discovery file."""

from __future__ import annotations

import atexit
import json
import os
import socket
from pathlib import Path

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from .collectors import CatalogueCollector, SystemCollector
from .recorder import Recorder


def build_registry(recorder: Recorder, extra_labels: dict[str, str] | None = None) -> CollectorRegistry:
    """A fresh registry holding only rlvitals collectors (no default process/GC collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CatalogueCollector(recorder, extra_labels))
    registry.register(SystemCollector(recorder, extra_labels))
    return registry


class MetricsServer(HTTPServer):
    """Serves /metrics from one thread, with a body rendered at most once per `cache_seconds`.

    The training loop shares the interpreter with this server, so every
    millisecond spent here is one it does not get. Hence: one rendering serves
    every scraper within `cache_seconds`, requests are answered one at a time
    (the kernel queues the rest: a deep listen backlog), and at most one per
    `min_interval` seconds, which bounds the server's share of the interpreter
    however many scrapers pile on. Each one is still answered, only later.
    """

    allow_reuse_address = True
    request_queue_size = 512
    timeout = None

    def __init__(self, address, registry: CollectorRegistry, cache_seconds: float = 0.5,
                 min_interval: float = 0.004):
        super().__init__(address, _MetricsHandler)
        self.registry = registry
        self.cache_seconds = cache_seconds
        self.min_interval = min_interval
        self._last_request = 0.0
        self._body = b""
        self._rendered_at = -1e9
        self._render_lock = threading.Lock()

    def body(self) -> bytes:
        with self._render_lock:
            now = time.monotonic()
            if now - self._rendered_at >= self.cache_seconds:
                self._body = generate_latest(self.registry)
                self._rendered_at = now
            return self._body

    def process_request(self, request, client_address):
        wait = self._last_request + self.min_interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # releases the interpreter to the training loop
        self._last_request = time.monotonic()
        super().process_request(request, client_address)


class _MetricsHandler(BaseHTTPRequestHandler):
    timeout = 5  # a client that stalls mid-request cannot hold the only server thread for long

    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served here")
            return
        body = self.server.body()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # scrapes are not worth a log line each
        pass


def start_metrics_server(host: str, port: int, registry: CollectorRegistry, cache_seconds: float = 0.5):
    server = MetricsServer((host, port), registry, cache_seconds)
    thread = threading.Thread(target=server.serve_forever, name="rlvitals-metrics", daemon=True)
    thread.start()
    return server, thread


class ProcessTelemetry:
    """Recorder + HTTP endpoint + discovery file for one process.

    The HTTP server runs in its own daemon thread (prometheus_client's threaded
    server), so scrapes never run inside the training loop.
    """

    def __init__(self, recorder: Recorder, registry: CollectorRegistry, server, thread, url: str,
                 target_file: Path | None):
        self.recorder = recorder
        self.registry = registry
        self._server, self._thread = server, thread
        self.url = url
        self.target_file = target_file
        self.port = server.server_address[1]

    @classmethod
    def start(cls, component: str, verbosity: str, host: str = "127.0.0.1", port: int = 0,
              discovery_dir: str | None = None, run_info: dict | None = None,
              extra_labels: dict[str, str] | None = None, target_labels: dict[str, str] | None = None,
              restore=None) -> "ProcessTelemetry":
        """Start serving. `restore(telemetry)` runs before the first scrape can be answered."""
        recorder = Recorder(verbosity, component)
        recorder.set_info(**(run_info or {}))
        registry = build_registry(recorder, extra_labels)
        if restore is not None:
            from types import SimpleNamespace

            restore(SimpleNamespace(recorder=recorder))
        server, thread = start_metrics_server(host, port, registry)
        bound = server.server_address[1]
        shown = host if host not in ("0.0.0.0", "::") else socket.gethostname()
        url = f"http://{shown}:{bound}/metrics"
        target_file = None
        if discovery_dir:
            labels = {"component": component, **(target_labels or {})}
            if run_info and "run_id" in run_info:
                labels["run_id"] = run_info["run_id"]
            target_file = write_target(discovery_dir, f"{component}-{os.getpid()}-{bound}",
                                       f"{shown}:{bound}", labels)
        telemetry = cls(recorder, registry, server, thread, url, target_file)
        atexit.register(telemetry.stop)
        return telemetry

    # The run loops talk to the recorder through these.
    @property
    def wants_value_trace(self) -> bool:
        return self.recorder.wants_value_trace

    @property
    def wants_debug(self) -> bool:
        return self.recorder.wants_debug

    def record_rollout(self, rollout) -> None:
        self.recorder.record_rollout(rollout)

    def record_learn(self, stats: dict, collected: int | None = None) -> None:
        self.recorder.record_learn(stats)

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


def write_target(directory: str, name: str, address: str, labels: dict[str, str]) -> Path:
    """Write a Prometheus file_sd target file atomically (Prometheus may read it at any moment)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    target = path / f"{name}.json"
    tmp = path / f".{name}.json.tmp"
    tmp.write_text(json.dumps([{"targets": [address], "labels": labels}]))
    os.replace(tmp, target)
    return target
