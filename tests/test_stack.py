"""`rlvitals stack up|down` with the real Prometheus, and `rlvitals dashboards push` against a recording server.

The stack runs with a PATH holding only what each test means to be installed,
so "Grafana absent" and "Prometheus absent" are real conditions here, and a
stand-in `grafana-server` (a tiny HTTP server) shows what Grafana would be
given: its config, its provisioning and, through its environment only, the
admin password.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import free_port, http_get
from rlvitals.dashboards import dashboard_files

REPO = Path(__file__).resolve().parent.parent


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the `prometheus` binary is not on PATH (Debian: apt-get install prometheus)")
    return binary


def bin_dir(tmp_path: Path, *tools: str) -> Path:
    """A folder for PATH holding links to just these installed tools."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for tool in tools:
        (folder / tool).symlink_to(shutil.which(tool))
    return folder


def cli(*args: str, path: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    secret = ("RLVITALS_GRAFANA_PASSWORD", "GF_SECURITY_ADMIN_PASSWORD", "GRAFANA_TOKEN", "GRAFANA_USER",
              "GRAFANA_PASSWORD")
    environ = {k: v for k, v in os.environ.items() if k not in secret}
    environ.update(env or {})
    environ["PATH"] = str(path)
    return subprocess.run([sys.executable, "-m", "rlvitals.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=environ)


def state(state_dir: Path) -> dict:
    return json.loads((state_dir / "state.json").read_text())


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(predicate, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def bystander():
    """A process the stack did not start: `stack down` must leave it alone."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


# ======================================================================
# stack up / down with the real Prometheus, Grafana absent
# ======================================================================
@pytest.mark.slow
def test_stack_up_and_down_with_prometheus_only(tmp_path, bystander):
    prometheus_binary()
    path = bin_dir(tmp_path, "prometheus")
    state_dir, run_dir, later_dir = tmp_path / "state", tmp_path / "run", tmp_path / "later"
    port = free_port()
    args = ["--state-dir", str(state_dir)]
    up = cli("stack", "up", "--run-dir", str(run_dir), "--prometheus-port", str(port), "--grafana-port",
             str(free_port()), "--scrape-interval", "1s", *args, path=path)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        url = f"http://127.0.0.1:{port}"
        assert f"Prometheus  {url}" in up.stdout
        # Grafana is absent: said clearly, with how to install it, and Prometheus is up anyway.
        assert re.search(r"Grafana\s+not started: Grafana is not installed", up.stdout), up.stdout
        assert "grafana-server" in up.stdout and "https://grafana.com/grafana/download" in up.stdout
        assert http_get(f"{url}/-/ready")[0] == 200
        recorded = state(state_dir)
        (prom,) = recorded["processes"]
        assert prom["name"] == "prometheus" and alive(prom["pid"])
        assert "password" not in json.dumps(recorded).lower()

        # The rendered config passes promtool and watches the run folder, which does not exist yet.
        config = state_dir / "prometheus" / "prometheus.yml"
        check = subprocess.run([shutil.which("promtool"), "check", "config", str(config)], capture_output=True,
                               text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        assert not run_dir.exists(), "stack up must not create the run directory (train refuses non-empty ones)"
        rules = json.loads(http_get(f"{url}/api/v1/rules")[1])["data"]["groups"]
        names = {r["name"] for g in rules for r in g["rules"]}
        expected = {r.get("alert") or r["record"] for f in (REPO / "deploy/prometheus/rules").glob("*.yml")
                    for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]}
        assert names == expected

        # A run appears later: its discovery file is picked up and scraped with its labels.
        (run_dir / "discovery").mkdir(parents=True)
        target = [{"targets": [f"127.0.0.1:{port}"], "labels": {"component": "local", "run_id": "stacktest"}}]
        (run_dir / "discovery" / "local-1.json").write_text(json.dumps(target))
        query = f"{url}/api/v1/query?query=up%7Brun_id%3D%22stacktest%22%7D"
        result = wait_for(lambda: json.loads(http_get(query)[1])["data"]["result"], 30, "the run's target")
        assert result[0]["metric"]["component"] == "local" and result[0]["metric"]["job"] == "rlvitals"

        # `up` again: no second Prometheus; a new run folder is added to the running one.
        again = cli("stack", "up", "--run-dir", str(later_dir), *args, path=path)
        assert again.returncode == 0, again.stderr
        assert "already up" in again.stdout and "now also watching" in again.stdout
        assert state(state_dir)["processes"] == recorded["processes"]
        wait_for(lambda: str(later_dir) in json.loads(http_get(f"{url}/api/v1/status/config")[1])["data"]["yaml"],
                 30, "the reloaded config")
        assert cli("stack", "status", *args, path=path).returncode == 0
    finally:
        down = cli("stack", "down", *args, path=path)
    assert down.returncode == 0, down.stderr
    assert f"stopped prometheus (pid {prom['pid']})" in down.stdout
    wait_for(lambda: not alive(prom["pid"]), 20, "Prometheus to stop")
    assert http_get(f"http://127.0.0.1:{port}/-/ready", timeout=2)[0] == 0
    assert not (state_dir / "state.json").exists()
    assert alive(bystander.pid), "stack down stopped a process it did not start"
    assert "nothing to stop" in cli("stack", "down", *args, path=path).stdout
    assert cli("stack", "status", *args, path=path).returncode == 1


def test_stack_down_leaves_a_reused_pid_alone(tmp_path, bystander):
    """A recorded pid now belonging to another process (start time differs) is not signalled."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    record = {"name": "prometheus", "pid": bystander.pid,
              "create_time": psutil.Process(bystander.pid).create_time() - 1000, "argv": [], "log": ""}
    (state_dir / "state.json").write_text(json.dumps({"backend": "native", "processes": [record], "urls": {}}))
    down = cli("stack", "down", "--state-dir", str(state_dir), path=tmp_path)
    assert down.returncode == 0 and "no longer running" in down.stdout
    time.sleep(0.3)
    assert alive(bystander.pid)


def test_missing_prometheus_is_named_with_how_to_install_it(tmp_path):
    empty = tmp_path / "emptybin"
    empty.mkdir()
    result = cli("stack", "up", "--state-dir", str(tmp_path / "state"), path=empty)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1
    assert "prometheus is not installed" in line and "apt-get install prometheus" in line
    assert "docker is not installed" in line  # and why the docker route is closed
    assert not (tmp_path / "state" / "state.json").exists()
    forced = cli("stack", "up", "--backend", "docker", "--state-dir", str(tmp_path / "state"), path=empty)
    assert forced.returncode == 2 and "docker is not installed" in forced.stderr


def test_a_busy_port_is_refused_before_anything_starts(tmp_path):
    prometheus_binary()
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        result = cli("stack", "up", "--prometheus-port", str(busy), "--state-dir", str(tmp_path / "s"),
                     path=bin_dir(tmp_path, "prometheus"))
    assert result.returncode == 2 and f"--prometheus-port={busy}" in result.stderr
    assert not (tmp_path / "s" / "state.json").exists()


# ======================================================================
# Grafana present (a stand-in): provisioning and the admin password
# ======================================================================
FAKE_GRAFANA = '''#!{python}
"""Stand-in for grafana-server: records what it was given, answers /api/health until SIGTERM."""
import configparser, json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

config = sys.argv[sys.argv.index("--config") + 1]
ini = configparser.ConfigParser()
ini.read(config)
with open(os.environ["FAKE_GRAFANA_RECORD"], "w") as out:
    json.dump({{"argv": sys.argv, "cwd": os.getcwd(), "password": os.environ.get("GF_SECURITY_ADMIN_PASSWORD"),
               "provisioning": ini["paths"]["provisioning"], "addr": ini["server"]["http_addr"]}}, out)


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{{"database": "ok", "version": "0.0.0-fake"}}'
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


HTTPServer((ini["server"]["http_addr"], int(ini["server"]["http_port"])), Health).serve_forever()
'''


@pytest.mark.slow
def test_grafana_gets_provisioning_and_a_password_that_is_printed_once_and_stored_nowhere(tmp_path):
    prometheus_binary()
    path = bin_dir(tmp_path, "prometheus")
    fake = path / "grafana-server"
    fake.write_text(FAKE_GRAFANA.format(python=sys.executable))
    fake.chmod(0o755)
    home = tmp_path / "grafana-home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "defaults.ini").write_text("")
    record = tmp_path / "record.json"
    env = {"FAKE_GRAFANA_RECORD": str(record), "RLVITALS_GRAFANA_HOME": str(home)}
    state_dir = tmp_path / "state"
    prom_port, graf_port = free_port(), free_port()
    ports = ["--prometheus-port", str(prom_port), "--grafana-port", str(graf_port), "--state-dir", str(state_dir)]

    up = cli("stack", "up", *ports, path=path, env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        match = re.search(r"password (\S+) \(generated; shown this once and stored nowhere\)", up.stdout)
        assert match, up.stdout
        password = match.group(1)
        assert len(password) >= 20 and up.stdout.count(password) == 1
        given = json.loads(record.read_text())
        assert given["password"] == password and given["addr"] == "127.0.0.1"
        assert given["argv"][1:3] == ["--homepath", str(home)] and given["cwd"] == str(home)
        assert f"http://127.0.0.1:{graf_port}/d/rlvitals-overview" in up.stdout
        for file in state_dir.rglob("*"):
            if file.is_file() and "data" not in file.relative_to(state_dir).parts:
                assert password not in file.read_text(errors="replace"), f"the password was written to {file}"
        prov = Path(given["provisioning"])
        (ds,) = yaml.safe_load(next((prov / "datasources").glob("*.yml")).read_text())["datasources"]
        assert ds["url"] == f"http://127.0.0.1:{prom_port}"
        (provider,) = yaml.safe_load(next((prov / "dashboards").glob("*.yml")).read_text())["providers"]
        assert {p.name for p in Path(provider["options"]["path"]).glob("*.json")} == {
            p.name for p in dashboard_files()}
        pids = [r["pid"] for r in state(state_dir)["processes"]]
        assert len(pids) == 2 and all(alive(p) for p in pids)
    finally:
        down = cli("stack", "down", "--state-dir", str(state_dir), path=path)
    assert down.returncode == 0 and "stopped grafana" in down.stdout and "stopped prometheus" in down.stdout
    wait_for(lambda: not any(alive(p) for p in pids), 20, "both to stop")

    # A password from the environment is used and never printed.
    up = cli("stack", "up", *ports, path=path, env={**env, "RLVITALS_GRAFANA_PASSWORD": "from-the-env-123"})
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "from-the-env-123" not in up.stdout + up.stderr and "RLVITALS_GRAFANA_PASSWORD" in up.stdout
        assert json.loads(record.read_text())["password"] == "from-the-env-123"
    finally:
        assert cli("stack", "down", "--state-dir", str(state_dir), path=path).returncode == 0


# ======================================================================
# dashboards push, against a server that records requests and answers as Grafana's API documents
# ======================================================================
class FakeGrafana(ThreadingHTTPServer):
    """Grafana's HTTP API, as far as `dashboards push` uses it: /api/health, /api/folders, /api/dashboards/db."""

    def __init__(self, token: str | None = None, basic: tuple[str, str] | None = None):
        super().__init__(("127.0.0.1", 0), _GrafanaHandler)
        self.token, self.basic = token, basic
        self.requests: list[dict] = []
        self.folders: dict[str, dict] = {}
        self.dashboards: dict[str, dict] = {}
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def authorised(self, header: str | None) -> bool:
        if self.token is not None:
            return header == f"Bearer {self.token}"
        expected = "Basic " + base64.b64encode(f"{self.basic[0]}:{self.basic[1]}".encode()).decode()
        return header == expected


class _GrafanaHandler(BaseHTTPRequestHandler):
    def _answer(self, status: int, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self, method: str) -> None:
        server: FakeGrafana = self.server
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        server.requests.append({"method": method, "path": self.path, "body": body,
                                "auth": self.headers.get("Authorization"),
                                "content_type": self.headers.get("Content-Type")})
        if method == "GET" and self.path == "/api/health":
            return self._answer(200, {"commit": "fake", "database": "ok", "version": "11.6.0"})
        if not server.authorised(self.headers.get("Authorization")):
            return self._answer(401, {"message": "Unauthorized"})
        if method == "GET" and self.path.startswith("/api/folders/"):
            uid = self.path.rsplit("/", 1)[1]
            if uid in server.folders:
                return self._answer(200, server.folders[uid])
            return self._answer(404, {"message": "folder not found", "status": "not-found"})
        if method == "POST" and self.path == "/api/folders":
            if not isinstance(body, dict) or not body.get("title"):
                return self._answer(400, {"message": "title is required"})
            folder = {"id": len(server.folders) + 1, "uid": body.get("uid") or "generated", "title": body["title"],
                      "url": f"/dashboards/f/{body.get('uid')}/", "version": 1}
            server.folders[folder["uid"]] = folder
            return self._answer(200, folder)
        if method == "POST" and self.path == "/api/dashboards/db":
            dash = (body or {}).get("dashboard")
            if not isinstance(dash, dict) or not dash.get("title"):
                return self._answer(400, {"message": "Dashboard title cannot be empty", "status": "empty-name"})
            folder_uid = body.get("folderUid")
            if folder_uid and folder_uid not in server.folders:
                return self._answer(400, {"message": "folder not found", "status": "folder-not-found"})
            if dash.get("uid") in server.dashboards and not body.get("overwrite"):
                return self._answer(412, {"message": "The dashboard has been changed by someone else",
                                          "status": "version-mismatch"})
            version = server.dashboards.get(dash.get("uid"), {}).get("version", 0) + 1
            server.dashboards[dash["uid"]] = {"dashboard": dash, "folderUid": folder_uid, "version": version}
            return self._answer(200, {"id": len(server.dashboards), "uid": dash["uid"], "status": "success",
                                      "url": f"/d/{dash['uid']}/slug", "version": version, "slug": "slug"})
        return self._answer(404, {"message": "Not found"})

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def log_message(self, *args):
        pass


@pytest.fixture
def grafana():
    servers = []

    def make(**auth) -> FakeGrafana:
        servers.append(FakeGrafana(**auth))
        return servers[-1]

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def push(monkeypatch, capsys):
    """`rlvitals dashboards push --url URL` in this process, with exactly `env` as Grafana credentials."""
    from rlvitals.cli import main

    def run(url: str, env: dict) -> subprocess.CompletedProcess:
        for name in ("GRAFANA_TOKEN", "GRAFANA_USER", "GRAFANA_PASSWORD", "GRAFANA_URL"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        code = main(["dashboards", "push", "--url", url])
        out = capsys.readouterr()
        return subprocess.CompletedProcess([], code, out.out, out.err)

    return run


def test_push_with_a_token_creates_the_folder_and_every_dashboard(grafana, push):
    server = grafana(token="glsa_test_token")
    result = push(server.url, {"GRAFANA_TOKEN": "glsa_test_token"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert [(r["method"], r["path"]) for r in server.requests] == [
        ("GET", "/api/health"), ("GET", "/api/folders/rlvitals"), ("POST", "/api/folders")] + \
        [("POST", "/api/dashboards/db")] * len(dashboard_files())
    assert all(r["auth"] == "Bearer glsa_test_token" for r in server.requests[1:])
    assert server.requests[2]["body"] == {"title": "rlvitals", "uid": "rlvitals"}
    for request, path in zip(server.requests[3:], dashboard_files(), strict=True):
        body = request["body"]
        assert request["content_type"].startswith("application/json")
        assert set(body) == {"dashboard", "folderUid", "overwrite", "message"}
        assert body["folderUid"] == "rlvitals" and body["overwrite"] is True and body["message"]
        committed = json.loads(path.read_text())
        assert body["dashboard"] == {**committed, "id": None}
    assert set(server.dashboards) == {"rlvitals-overview", "rlvitals-learning", "rlvitals-systems"}
    for uid in server.dashboards:
        assert f"{server.url}/d/{uid}/slug (version 1)" in result.stdout

    # Pushing again updates in place: the folder is found, the dashboards are overwritten.
    server.requests.clear()
    again = push(server.url, {"GRAFANA_TOKEN": "glsa_test_token"})
    assert again.returncode == 0, again.stderr
    assert ("POST", "/api/folders") not in [(r["method"], r["path"]) for r in server.requests]
    assert all(d["version"] == 2 for d in server.dashboards.values())


def test_push_with_basic_auth(grafana, push):
    server = grafana(basic=("editor", "s3cret"))
    result = push(server.url, {"GRAFANA_USER": "editor", "GRAFANA_PASSWORD": "s3cret"})
    assert result.returncode == 0, result.stderr
    expected = "Basic " + base64.b64encode(b"editor:s3cret").decode()
    assert all(r["auth"] == expected for r in server.requests if r["path"] != "/api/health")
    assert len(server.dashboards) == len(dashboard_files())


def test_push_reports_refused_credentials(grafana, push):
    server = grafana(token="right")
    result = push(server.url, {"GRAFANA_TOKEN": "wrong"})
    assert result.returncode == 1
    assert "HTTP 401" in result.stderr and "GRAFANA_TOKEN" in result.stderr
    assert server.dashboards == {}


def test_push_takes_credentials_only_from_the_environment(grafana, push):
    server = grafana(token="t")
    missing = push(server.url, {})
    assert missing.returncode == 2 and "GRAFANA_TOKEN" in missing.stderr
    in_url = push(server.url.replace("http://", "http://admin:admin@"), {"GRAFANA_TOKEN": "t"})
    assert in_url.returncode == 2 and "must not contain credentials" in in_url.stderr
    assert server.requests == []
    unreachable = push(f"http://127.0.0.1:{free_port()}", {"GRAFANA_TOKEN": "t"})
    assert unreachable.returncode == 1 and "cannot reach Grafana" in unreachable.stderr
