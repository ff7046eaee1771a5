"""The /metrics server against hostile clients: real processes, real sockets on 127.0.0.1, real Prometheus.

A normal scrape must be answered promptly however many idle, trickling or
never-reading connections are open. Bounds are generous (the machine is
shared): they prove that nothing waits for a slow client, not how fast a
scrape is.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import free_port, http_get, prometheus_watching

SERVE = """
import sys
from rlvitals.telemetry.process import build_registry
from rlvitals.telemetry.recorder import Recorder
from rlvitals.telemetry.server import start_metrics_server

recorder = Recorder("standard", "local")
recorder.set_info(run_id="hostile-test")
server, _ = start_metrics_server("127.0.0.1", 0, build_registry(recorder), **{options})
print(server.server_address[1], flush=True)
sys.stdin.read()  # serve until the test closes our stdin
print(json.dumps(server.stats), flush=True)
"""

PROMPT = 1.0
"""Seconds within which a normal scrape must be answered while hostile clients are connected."""


class Served:
    """A metrics server in a process of its own."""

    def __init__(self, **options):
        code = "import json\n" + SERVE.replace("{options}", repr(options))
        self.process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert line.strip().isdigit(), f"server did not start: {self.process.stderr.read()}"
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}/metrics"

    def close(self) -> dict:
        out, err = self.process.communicate(input="", timeout=30)
        assert self.process.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def served(request):
    options = getattr(request, "param", {})
    server = Served(**options)
    yield server
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def timed_scrape(url: str) -> tuple[int, float, bytes]:
    t0 = time.monotonic()
    status, body = http_get(url, timeout=10)
    return status, time.monotonic() - t0, body


def closed_by_server(sock: socket.socket, wait: float) -> bool:
    """True if the server closed (or reset) `sock` within `wait` seconds."""
    sock.settimeout(wait)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


@pytest.mark.parametrize("served", [{"request_timeout": 3.0}], indirect=True)
def test_a_trickling_client_does_not_delay_scrapes_and_is_cut_off_at_its_deadline(served):
    sock = connect(served.port)
    stop = threading.Event()
    cut_off = []

    def trickle():  # one byte every 0.4 s: never a complete request
        t0 = time.monotonic()
        try:
            for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
                if stop.is_set():
                    return
                sock.sendall(bytes([byte]))
                time.sleep(0.4)
        except OSError:
            cut_off.append(time.monotonic() - t0)

    thread = threading.Thread(target=trickle)
    thread.start()
    try:
        time.sleep(0.5)
        for _ in range(8):
            status, seconds, body = timed_scrape(served.url)
            assert status == 200 and b"rlvitals_run_info" in body
            assert seconds < PROMPT, f"a scrape took {seconds:.2f} s while a client trickled"
            time.sleep(0.1)
        thread.join(timeout=10)
        assert cut_off, "the trickler was never cut off"
        assert cut_off[0] < 3.0 + 2.0, f"the trickler was cut off only after {cut_off[0]:.1f} s (deadline 3 s)"
    finally:
        stop.set()
        thread.join()
        sock.close()
    stats = served.close()
    assert stats["dropped_deadline"] >= 1


def test_idle_and_never_reading_connections_do_not_delay_scrapes(served):
    idle = [connect(served.port) for _ in range(40)]
    half = [connect(served.port) for _ in range(10)]
    for sock in half:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # an unfinished request
    deaf = []
    for _ in range(10):  # complete requests whose answers are never read
        sock = connect(served.port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        deaf.append(sock)
    try:
        for _ in range(10):
            status, seconds, body = timed_scrape(served.url)
            assert status == 200 and body.endswith(b"\n")
            assert seconds < PROMPT, f"a scrape took {seconds:.2f} s with 60 idle or deaf connections open"
    finally:
        for sock in idle + half + deaf:
            sock.close()


@pytest.mark.parametrize("served", [{"max_connections": 8, "request_timeout": 30.0}], indirect=True)
def test_at_the_connection_cap_the_oldest_idle_connection_is_dropped(served):
    oldest = [connect(served.port) for _ in range(8)]
    time.sleep(0.3)  # accepted before the rest
    newer = [connect(served.port) for _ in range(8)]
    try:
        time.sleep(0.5)
        assert all(closed_by_server(s, 2.0) for s in oldest), "the oldest idle connections were kept"
        status, seconds, _ = timed_scrape(served.url)
        assert status == 200 and seconds < PROMPT
        # The scrape itself took a slot from one of the newer idle ones; the rest are still open.
        assert sum(not closed_by_server(s, 0.2) for s in newer) >= 6
    finally:
        for sock in oldest + newer:
            sock.close()
    assert served.close()["dropped_cap"] >= 8


@pytest.mark.parametrize("served", [{"max_request_bytes": 2048}], indirect=True)
def test_bad_requests_get_one_short_answer_each(served):
    def ask(raw: bytes) -> bytes:
        with connect(served.port) as sock:
            sock.sendall(raw)
            chunks = []
            while True:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks)

    assert ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000).startswith(b"HTTP/1.1 431 ")
    assert ask(b"GET /admin HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    assert ask(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert ask(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert ask(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    status, body = http_get(served.url)
    assert status == 200 and b"rlvitals_run_info" in body
    assert served.close()["too_large"] == 1


class Hostile:
    """Keeps `idle` silent connections, `tricklers` slow ones and `deaf` never-reading ones open to a port,
    reopening each as soon as the server drops it, until stopped."""

    def __init__(self, port: int, idle: int = 150, tricklers: int = 5, deaf: int = 10):
        self.port = port
        self.stop = threading.Event()
        self.opened = 0
        self.threads = ([threading.Thread(target=self._idle) for _ in range(idle)]
                        + [threading.Thread(target=self._trickle) for _ in range(tricklers)]
                        + [threading.Thread(target=self._deaf) for _ in range(deaf)])

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)

    def _open(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=1)
        except OSError:
            self.stop.wait(0.2)
            return None
        self.opened += 1
        return sock

    def _idle(self):
        while not self.stop.is_set():
            sock = self._open()
            if sock is not None:
                with sock:
                    sock.settimeout(0.5)
                    while not self.stop.is_set():
                        try:
                            if sock.recv(1) == b"":
                                break
                        except TimeoutError:
                            continue
                        except OSError:
                            break

    def _trickle(self):
        while not self.stop.is_set():
            sock = self._open()
            if sock is not None:
                with sock:
                    try:
                        for byte in b"GET /metrics HTTP/1.1\r\nHost: slow" + b"w" * 10000:
                            if self.stop.wait(0.5):
                                break
                            sock.sendall(bytes([byte]))
                    except OSError:
                        pass

    def _deaf(self):
        while not self.stop.is_set():
            sock = self._open()
            if sock is not None:
                with sock:
                    try:
                        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: deaf\r\n\r\n")
                    except OSError:
                        continue
                    self.stop.wait(8)


@pytest.mark.slow
def test_prometheus_keeps_a_training_run_up_while_hostile_clients_hold_connections(tmp_path):
    """Real training process, real Prometheus (1 s interval, 1 s timeout), 165 hostile connections."""
    run_dir = tmp_path / "run"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlvitals.cli", "train", "--total-env-steps", "100000000",
                             "--run-dir", str(run_dir), "--metrics-port", str(port), "--verbosity", "minimal",
                             "--progress", "false"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and not list((run_dir / "discovery").glob("*.json")):
            assert time.monotonic() < deadline, "the run wrote no discovery file"
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1]
        with prometheus_watching(run_dir / "discovery") as prom:
            deadline = time.monotonic() + 60
            while not prom.query('up{job="rlvitals"} == 1'):
                assert time.monotonic() < deadline, f"never up; targets: {prom.targets()}"
                time.sleep(0.25)
            with Hostile(port) as hostile:
                deadline = time.monotonic() + 60   # only a hung test waits this long for its connections
                while hostile.opened < 150:
                    assert time.monotonic() < deadline, f"only {hostile.opened} hostile connections opened"
                    time.sleep(0.1)
                # The queries below look back 10 s: a window wholly inside the hostile period (a span of
                # the measurement itself, not a wait for something to happen).
                time.sleep(11)
                slow = [timed_scrape(f"http://127.0.0.1:{port}/metrics") for _ in range(3)]
                up = prom.query('min_over_time(up{job="rlvitals"}[10s])')
                samples = prom.query('count_over_time(up{job="rlvitals"}[10s])')
                durations = prom.query('max_over_time(scrape_duration_seconds{job="rlvitals"}[10s])')
            assert up and float(up[0]["value"][1]) == 1.0, f"target went down: {prom.targets()}"
            assert samples and float(samples[0]["value"][1]) >= 6, samples
            assert float(durations[0]["value"][1]) < PROMPT, durations
            assert all(s == 200 and t < PROMPT for s, t, _ in slow), [(s, t) for s, t, _ in slow]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "terminated"  # stopped by SIGTERM
