"""A real Prometheus that scrapes one run's discovery folder and evaluates the generated alert rules every second."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from conftest import _start, _stop, http_get
from rlvitals.stack.render import render_prometheus_config


class RulesPrometheus:
    """A Prometheus scraping and evaluating the generated rules every second, watching one run's discovery."""

    def __init__(self, discovery: Path):
        self.tmp = tempfile.TemporaryDirectory(prefix="rlvitals-fleet-ray-")
        root = Path(self.tmp.name)
        config = render_prometheus_config([str(discovery / "*.json")], "1s").replace(
            "evaluation_interval: 5s", "evaluation_interval: 1s")
        (root / "prometheus.yml").write_text(config)
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("the `prometheus` binary is not on PATH (Debian: apt-get install prometheus)")
        self.process, self.url, self.log = _start(binary, root, 0)
        deadline = time.monotonic() + 60
        while http_get(f"{self.url}/-/ready", timeout=1)[0] != 200:
            assert time.monotonic() < deadline and self.process.poll() is None, self.log.read_text()[-2000:]
            time.sleep(0.2)

    def alerts(self) -> list[dict]:
        status, body = http_get(f"{self.url}/api/v1/alerts")
        assert status == 200, body[:300]
        return json.loads(body)["data"]["alerts"]

    def query(self, promql: str) -> list[dict]:
        from urllib.parse import quote

        status, body = http_get(f"{self.url}/api/v1/query?query={quote(promql)}")
        assert status == 200, body[:300]
        return json.loads(body)["data"]["result"]

    def up_actors(self) -> int:
        status, body = http_get(f"{self.url}/api/v1/query?query=count(up%7Bcomponent%3D%22actor%22%7D%3D%3D1)")
        result = json.loads(body)["data"]["result"] if status == 200 else []
        return int(result[0]["value"][1]) if result else 0

    def close(self) -> None:
        _stop(self.process)
        self.tmp.cleanup()
