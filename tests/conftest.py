"""Shared fixtures: a real Prometheus server that discovers targets from a folder."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

PROMETHEUS_CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: rlvitals
    file_sd_configs:
      - files: ['{discovery}/*.json']
        refresh_interval: 1s
"""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


@dataclass
class Prometheus:
    url: str
    """Base URL, e.g. http://127.0.0.1:9090"""
    discovery_dir: Path
    """Folder of file_sd target files (*.json) Prometheus re-reads every second."""
    process: subprocess.Popen
    log_path: Path

    def query(self, promql: str) -> list[dict]:
        """Instant query over the HTTP API: the `result` list (vector: [{metric: {...}, value: [t, v]}])."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        status, body = http_get(url)
        if status != 200:
            raise AssertionError(f"Prometheus query {promql!r} failed with HTTP {status}: {body[:300]!r}")
        payload = json.loads(body)
        if payload.get("status") != "success":
            raise AssertionError(f"Prometheus query {promql!r} failed: {payload}")
        return payload["data"]["result"]

    def targets(self) -> list[dict]:
        """Active scrape targets as /api/v1/targets reports them."""
        status, body = http_get(f"{self.url}/api/v1/targets")
        assert status == 200, f"/api/v1/targets answered HTTP {status}"
        return json.loads(body)["data"]["activeTargets"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def _start(binary: str, root: Path, attempt: int) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    data = root / f"data{attempt}"
    log_path = root / f"prometheus{attempt}.log"
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [binary, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    return process, f"http://127.0.0.1:{port}", log_path


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory):
    """A real Prometheus on 127.0.0.1 scraping every 1 s whatever `discovery_dir/*.json` lists."""
    discovery = tmp_path_factory.mktemp("prometheus") / "discovery"
    discovery.mkdir()
    with prometheus_watching(discovery) as server:
        yield server


class prometheus_watching:
    """Context manager: a Prometheus of its own, scraping every 1 s whatever `discovery_dir/*.json` lists.

    The session fixture `prometheus` uses it with a folder of its own; tests may also
    point one straight at a run's discovery folder.
    """

    def __init__(self, discovery_dir: Path):
        self.discovery_dir = Path(discovery_dir)

    def __enter__(self) -> Prometheus:
        import tempfile

        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("the `prometheus` binary is not on PATH: install it (Debian: apt-get install prometheus; "
                        "`bash deploy/setup.sh --test` does) to run the Prometheus end-to-end tests")
        self._tmp = tempfile.TemporaryDirectory(prefix="rlvitals-prom-")
        root = Path(self._tmp.name)
        (root / "prometheus.yml").write_text(PROMETHEUS_CONFIG.format(discovery=self.discovery_dir))
        problems = []
        for attempt in range(3):  # the free port can be taken between our check and Prometheus's bind
            process, url, log_path = _start(binary, root, attempt)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and process.poll() is None:
                if http_get(f"{url}/-/ready", timeout=1)[0] == 200:
                    self.server = Prometheus(url, self.discovery_dir, process, log_path)
                    return self.server
                time.sleep(0.1)
            _stop(process)
            problems.append(f"attempt {attempt}: exit code {process.returncode}; log:\n"
                            f"{log_path.read_text(errors='replace')[-2000:]}")
        self._tmp.cleanup()
        pytest.fail("Prometheus did not become ready:\n" + "\n".join(problems))

    def __exit__(self, *exc) -> None:
        _stop(self.server.process)
        self._tmp.cleanup()
