"""A process's telemetry endpoint: registry, /metrics server and file_sd discovery file."""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
from pathlib import Path

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


class MetricsServer:
    """A deliberately small HTTP server for /metrics, on one thread.

    The training loop shares the interpreter with this server, so every
    millisecond spent here is one it does not get. Hence: one rendering serves
    every scraper within `cache_seconds`; a request costs a socket read, a look at
    its first line and one `sendall` of a prebuilt response (no header parsing, no
    per-request objects); requests are answered one at a time, at most one per
    `min_interval` seconds, while the kernel queues the rest (a deep backlog).
    However many scrapers pile on, the server's share of the interpreter stays
    bounded and each is still answered, only later.
    """

    def __init__(self, address, registry: CollectorRegistry, cache_seconds: float = 0.5,
                 min_interval: float = 0.005):
        self.registry = registry
        self.cache_seconds = cache_seconds
        self.min_interval = min_interval
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(address)
        self.socket.listen(512)
        self.socket.settimeout(0.5)  # so shutdown() is noticed
        self.server_address = self.socket.getsockname()
        self._response = b""
        self._header_length = 0
        self._rendered_at = -1e9
        self._stop = threading.Event()
        self._stopped = threading.Event()

    def body(self) -> bytes:
        return self._current()[self._header_length:]

    def _current(self) -> bytes:
        now = time.monotonic()
        if now - self._rendered_at >= self.cache_seconds:
            body = generate_latest(self.registry)
            header = (f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE_PLAIN_0_0_4}\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
            self._header_length = len(header)
            self._response = header + body
            self._rendered_at = now
        return self._response

    def serve_forever(self) -> None:
        last = 0.0
        try:
            while not self._stop.is_set():
                try:
                    conn, _ = self.socket.accept()
                except (socket.timeout, BlockingIOError):
                    continue
                except OSError:
                    break
                wait = last + self.min_interval - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # releases the interpreter to the training loop
                last = time.monotonic()
                self._answer(conn)
        finally:
            self._stopped.set()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)  # a stalled client cannot hold the only server thread for long
            request = conn.recv(8192)
            while b"\r\n\r\n" not in request and len(request) < 65536:
                more = conn.recv(8192)
                if not more:
                    break
                request += more
            first = request.split(b"\r\n", 1)[0].split()
            path = first[1].split(b"?", 1)[0] if len(first) >= 2 else b""
            if len(first) >= 2 and first[0] == b"GET" and path in (b"/metrics", b"/"):
                conn.sendall(self._current())
            else:
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 27\r\n"
                             b"Connection: close\r\n\r\nonly /metrics is served here")
        except OSError:
            pass
        finally:
            conn.close()

    def shutdown(self) -> None:
        self._stop.set()
        self._stopped.wait(5)

    def server_close(self) -> None:
        self.socket.close()


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

    def record_learn(self, stats: dict) -> None:
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
