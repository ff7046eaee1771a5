"""`rlvitals stack up|down|status`: Prometheus and Grafana for watching runs, on loopback.

`up` starts Prometheus with deploy/prometheus (its rules, and a rendered copy of
prometheus.yml that watches the `--run-dir`s' discovery folders), and Grafana
with deploy/grafana's provisioning where Grafana is installed; or both through
`docker compose` (deploy/docker-compose.yml) where Prometheus is not installed
and Docker is (or with --backend docker). `down` stops exactly what `up`
started: the processes (pid and start time) or the compose project recorded in
the state folder, nothing else.

The Grafana admin password is never a default: it comes from
RLVITALS_GRAFANA_PASSWORD (or GF_SECURITY_ADMIN_PASSWORD), or is generated,
printed once and stored nowhere; it reaches Grafana through its environment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
PROVISIONING = DEPLOY / "grafana" / "provisioning"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
STATE_FILE = "state.json"
PASSWORD_ENV = ("RLVITALS_GRAFANA_PASSWORD", "GF_SECURITY_ADMIN_PASSWORD")
HOST = "127.0.0.1"
READY_TIMEOUT = 60.0

INSTALL_PROMETHEUS = ("install it with `sudo apt-get install prometheus` (Debian/Ubuntu; `bash deploy/setup.sh --test` "
                      "does this) or from https://prometheus.io/download/")
INSTALL_GRAFANA = ("install it from https://grafana.com/grafana/download (Debian/Ubuntu: add the APT repository "
                   "https://apt.grafana.com, then `sudo apt-get install grafana`)")
INSTALL_DOCKER = "install Docker Engine and its compose plugin: https://docs.docker.com/engine/install/"


class StackError(Exception):
    """A one-line reason `stack` cannot do what was asked; `code` is the exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def say(text: str) -> None:
    print(f"rlvitals: {text}", flush=True)


def default_state_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rlvitals" / "stack"


# ------------------------------------------------------------------ rendering
def discovery_globs(run_dirs: list[str], state_dir: Path) -> list[str]:
    """The file_sd patterns the rlvitals job watches: each run's discovery folder, then the state's targets/."""
    globs = [str(Path(d).expanduser().resolve() / "discovery" / "*.json") for d in run_dirs]
    return list(dict.fromkeys(globs + [str(state_dir / "targets" / "*.json")]))


def render_prometheus_config(globs: list[str], scrape_interval: str | None = None,
                             rules_dir: Path = DEPLOY / "prometheus" / "rules") -> str:
    """deploy/prometheus/prometheus.yml with absolute rule paths and the rlvitals job watching `globs`."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["rule_files"] = [str(rules_dir / Path(p).name) for p in config.get("rule_files", [])]
    if scrape_interval:
        config["global"]["scrape_interval"] = scrape_interval
        config["global"]["scrape_timeout"] = scrape_interval
    for job in config["scrape_configs"]:
        if job["job_name"] == "rlvitals":
            for sd in job["file_sd_configs"]:
                sd["files"] = list(globs)
                if scrape_interval:
                    sd["refresh_interval"] = scrape_interval
    header = (f"# Rendered by `rlvitals stack up` from {PROMETHEUS_CONFIG}; edits here are overwritten.\n")
    return header + yaml.safe_dump(config, sort_keys=False)


def render_provisioning(target: Path, prometheus_url: str, scrape_interval: str, dashboards_path: str) -> Path:
    """A copy of deploy/grafana/provisioning pointing at this Prometheus and this dashboards folder."""
    if target.exists():
        shutil.rmtree(target)
    for source in PROVISIONING.rglob("*.yml"):
        data = yaml.safe_load(source.read_text())
        for ds in data.get("datasources", []):
            ds["url"] = prometheus_url
            ds.setdefault("jsonData", {})["timeInterval"] = scrape_interval
        for provider in data.get("providers", []):
            provider["options"]["path"] = dashboards_path
        out = target / source.relative_to(PROVISIONING)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"# Rendered by `rlvitals stack up` from {source}.\n" + yaml.safe_dump(data, sort_keys=False))
    for folder in ("plugins", "alerting", "notifiers"):
        (target / folder).mkdir(parents=True, exist_ok=True)
    return target


def grafana_ini(state_dir: Path, port: int, dashboards_dir: Path) -> str:
    g = state_dir / "grafana"
    return "\n".join([
        "# Written by `rlvitals stack up`. The admin password is not here: it is passed in the environment.",
        "[paths]", f"data = {g / 'data'}", f"logs = {g / 'logs'}", f"plugins = {g / 'plugins'}",
        f"provisioning = {g / 'provisioning'}",
        "[server]", f"http_addr = {HOST}", f"http_port = {port}",
        "[security]", "admin_user = admin",
        "[users]", "allow_sign_up = false",
        "[auth.anonymous]", "enabled = false",
        "[analytics]", "reporting_enabled = false", "check_for_updates = false", "check_for_plugin_updates = false",
        "[dashboards]", f"default_home_dashboard_path = {dashboards_dir / 'overview.json'}", ""])


# ------------------------------------------------------------------ state
def read_state(state_dir: Path) -> dict | None:
    path = state_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def write_state(state_dir: Path, state: dict) -> None:
    tmp = state_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, state_dir / STATE_FILE)


def _ours(record: dict):
    """The psutil.Process of a recorded process if it is still the one we started (pid and start time), else None."""
    import psutil

    try:
        proc = psutil.Process(record["pid"])
        if abs(proc.create_time() - record["create_time"]) > 0.5 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError):
        return None


def running(state: dict | None) -> bool:
    if not state:
        return False
    if state.get("backend") == "docker":
        return True
    return any(_ours(r) is not None for r in state.get("processes", []))


# ------------------------------------------------------------------ helpers
def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout, OSError):
        return False


def port_free(port: int) -> bool:
    """Whether a server could listen on the port now (as Prometheus and Grafana do: TIME_WAIT does not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
            return True
        except OSError:
            return False


def tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def wait_ready(url: str, proc: subprocess.Popen | None, log: Path | None, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if http_ok(url):
            return
        if proc is not None and proc.poll() is not None:
            raise StackError(f"{what} exited with status {proc.returncode} before it was ready; its log "
                             f"({log}) ends:\n{tail(log) if log else ''}", code=1)
        time.sleep(0.2)
    raise StackError(f"{what} did not answer {url} within {READY_TIMEOUT:g} s; log: {log}", code=1)


def spawn(name: str, argv: list[str], log: Path, env: dict | None = None, cwd: Path | None = None):
    """Start a daemon in its own session, output to `log`; returns (Popen, state record)."""
    import psutil

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=cwd)
    record = {"name": name, "pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(),
              "argv": argv, "log": str(log)}
    return proc, record


def stop_process(record: dict, timeout: float = 20.0) -> bool:
    """Terminate a recorded process if it is still ours; True if it was running."""
    import psutil

    proc = _ours(record)
    if proc is None:
        return False
    proc.terminate()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        proc.wait(timeout=0.1)  # reaps it if it is our child (tests), harmless otherwise
    except (psutil.TimeoutExpired, psutil.NoSuchProcess, ChildProcessError):
        pass
    return True


def find_grafana() -> tuple[list[str], Path | None] | None:
    """(command prefix, home path) of an installed Grafana, or None."""
    binary = shutil.which("grafana")
    prefix = [binary, "server"] if binary else None
    if prefix is None:
        binary = shutil.which("grafana-server")
        prefix = [binary] if binary else None
    if prefix is None:
        return None
    real = Path(binary).resolve()
    candidates = [os.environ.get("RLVITALS_GRAFANA_HOME"), real.parent.parent, Path("/usr/share/grafana"),
                  Path("/usr/local/share/grafana")]
    home = next((Path(c) for c in candidates if c and (Path(c) / "conf" / "defaults.ini").is_file()), None)
    return prefix, home


def docker_problem() -> str | None:
    """Why `docker compose` cannot be used here, or None when it can."""
    if shutil.which("docker") is None:
        return "docker is not installed (no `docker` on PATH)"
    try:
        if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode != 0:
            return "docker's compose plugin is not installed (`docker compose version` fails)"
        if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
            return "the Docker daemon is not reachable (`docker info` fails)"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker does not answer ({exc})"
    return None


def grafana_password() -> tuple[str, bool]:
    """(password, generated?): from the environment, else a fresh random one."""
    for name in PASSWORD_ENV:
        if os.environ.get(name):
            return os.environ[name], False
    return secrets.token_urlsafe(18), True


def announce_password(password: str, generated: bool) -> str:
    if generated:
        return f"user admin, password {password} (generated; shown this once and stored nowhere)"
    return "user admin, password from $" + next(n for n in PASSWORD_ENV if os.environ.get(n))


# ------------------------------------------------------------------ up
def up(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "targets").mkdir(exist_ok=True)
    state = read_state(state_dir)
    if running(state):
        return already_up(state_dir, state, args)
    if state:
        (state_dir / STATE_FILE).unlink()  # left by processes that ended without `down`
    backend = choose_backend(args.backend)
    globs = discovery_globs(args.run_dir, state_dir)
    for port, flag in ((args.prometheus_port, "--prometheus-port"), (args.grafana_port, "--grafana-port")):
        if not port_free(port):
            raise StackError(f"{flag}={port} is invalid: port {port} on {HOST} is in use; expected a free port")
    if backend == "docker":
        return up_docker(args, state_dir, globs)
    return up_native(args, state_dir, globs)


def choose_backend(requested: str) -> str:
    if requested == "native":
        if shutil.which("prometheus") is None:
            raise StackError(f"prometheus is not installed (no `prometheus` on PATH): {INSTALL_PROMETHEUS}")
        return "native"
    if requested == "docker":
        problem = docker_problem()
        if problem:
            raise StackError(f"--backend docker: {problem}: {INSTALL_DOCKER}")
        return "docker"
    if shutil.which("prometheus") is not None:
        return "native"
    problem = docker_problem()
    if problem is None:
        return "docker"
    raise StackError(f"prometheus is not installed (no `prometheus` on PATH): {INSTALL_PROMETHEUS}; "
                     f"or, to run Prometheus and Grafana in containers, {INSTALL_DOCKER} ({problem})")


def up_native(args: argparse.Namespace, state_dir: Path, globs: list[str]) -> int:
    from rlvitals.dashboards import DASHBOARD_DIR

    prom_dir = state_dir / "prometheus"
    prom_dir.mkdir(exist_ok=True)
    config = prom_dir / "prometheus.yml"
    config.write_text(render_prometheus_config(globs, args.scrape_interval))
    prom_url = f"http://{HOST}:{args.prometheus_port}"
    argv = [shutil.which("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={prom_dir / 'data'}",
            f"--web.listen-address={HOST}:{args.prometheus_port}", "--storage.tsdb.retention.time=30d"]
    state = {"backend": "native", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "run_dirs": list(args.run_dir),
             "scrape_interval": args.scrape_interval, "urls": {"prometheus": prom_url}, "processes": []}
    proc, record = spawn("prometheus", argv, prom_dir / "prometheus.log")
    state["processes"].append(record)
    write_state(state_dir, state)  # recorded before waiting: `down` can stop it whatever happens next
    try:
        wait_ready(f"{prom_url}/-/ready", proc, prom_dir / "prometheus.log", "Prometheus")
    except StackError:
        stop_process(record)
        (state_dir / STATE_FILE).unlink(missing_ok=True)
        raise
    say(f"Prometheus  {prom_url}  (alerts: {prom_url}/alerts)")
    for pattern in globs:
        say(f"  watching {pattern}")

    grafana = find_grafana()
    if grafana is None:
        say(f"Grafana     not started: Grafana is not installed (neither `grafana` nor `grafana-server` is on PATH); "
            f"{INSTALL_GRAFANA}, then `rlvitals stack down` and `rlvitals stack up` again; or run both in containers "
            "with --backend docker. Prometheus runs without it.")
    else:
        prefix, home = grafana
        g_dir = state_dir / "grafana"
        if (g_dir / "data").exists():
            shutil.rmtree(g_dir / "data")  # a fresh database: the password below is the one in force
        scrape = args.scrape_interval or yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]
        render_provisioning(g_dir / "provisioning", prom_url, scrape, str(DASHBOARD_DIR))
        ini = g_dir / "grafana.ini"
        ini.write_text(grafana_ini(state_dir, args.grafana_port, DASHBOARD_DIR))
        password, generated = grafana_password()
        env = {**os.environ, "GF_SECURITY_ADMIN_PASSWORD": password}
        argv = prefix + (["--homepath", str(home)] if home else []) + ["--config", str(ini)]
        g_proc, g_record = spawn("grafana", argv, g_dir / "grafana.log", env=env, cwd=home)
        state["processes"].append(g_record)
        grafana_url = f"http://{HOST}:{args.grafana_port}"
        state["urls"]["grafana"] = grafana_url
        write_state(state_dir, state)
        try:
            wait_ready(f"{grafana_url}/api/health", g_proc, g_dir / "grafana.log", "Grafana")
        except StackError as exc:
            raise StackError(f"{exc}\n(Prometheus is up; `rlvitals stack down{state_flag(args)}` stops it)",
                             exc.code) from None
        say(f"Grafana     {grafana_url}/d/rlvitals-overview  ({announce_password(password, generated)})")
    say(f"state in {state_dir}; stop with `rlvitals stack down{state_flag(args)}`")
    return 0


def state_flag(args: argparse.Namespace) -> str:
    return "" if Path(args.state_dir).expanduser().resolve() == default_state_dir().resolve() \
        else f" --state-dir {args.state_dir}"


def already_up(state_dir: Path, state: dict, args: argparse.Namespace) -> int:
    """`up` on a running stack: add any new run folders (native: re-render and SIGHUP Prometheus)."""
    new = [d for d in args.run_dir if str(Path(d).expanduser().resolve()) not in
           {str(Path(r).expanduser().resolve()) for r in state.get("run_dirs", [])}]
    if new and state.get("backend") == "native":
        state["run_dirs"] = state.get("run_dirs", []) + new
        globs = discovery_globs(state["run_dirs"], state_dir)
        (state_dir / "prometheus" / "prometheus.yml").write_text(
            render_prometheus_config(globs, state.get("scrape_interval")))
        record = next(r for r in state["processes"] if r["name"] == "prometheus")
        proc = _ours(record)
        if proc is None:
            raise StackError("the stack's Prometheus is gone; run `rlvitals stack down` then `rlvitals stack up`",
                             code=1)
        proc.send_signal(signal.SIGHUP)  # Prometheus re-reads its configuration
        write_state(state_dir, state)
        for d in new:
            say(f"now also watching {Path(d).expanduser().resolve() / 'discovery' / '*.json'}")
    elif new:
        raise StackError("the stack runs in Docker and watches fixed folders; `rlvitals stack down` and up again "
                         "with every --run-dir")
    say("the stack is already up")
    for name, url in state.get("urls", {}).items():
        say(f"{name:<11} {url}")
    return 0


def up_docker(args: argparse.Namespace, state_dir: Path, globs: list[str]) -> int:
    """Both services through `docker compose`, with an override for the runs to watch and the ports."""
    prom_dir = state_dir / "prometheus"
    prom_dir.mkdir(exist_ok=True)
    config = prom_dir / "prometheus.yml"
    config.write_text(render_prometheus_config(globs, args.scrape_interval, rules_dir=Path("/etc/prometheus/rules")))
    prom_url = f"http://{HOST}:{args.prometheus_port}"
    scrape = args.scrape_interval or yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]
    provisioning = render_provisioning(state_dir / "grafana" / "provisioning", prom_url, scrape,
                                       "/var/lib/rlvitals/dashboards")
    # Each watched run folder is mounted read-only at the same path. A missing one is created here, empty (which
    # `rlvitals train --run-dir` accepts), rather than by Docker as root (which it would not).
    mounts = sorted({str(Path(g).parent.parent) for g in globs})
    for mount in mounts:
        Path(mount).mkdir(parents=True, exist_ok=True)
    override = {"services": {
        "prometheus": {"volumes": [f"{config}:/etc/prometheus/prometheus.yml:ro"] + [f"{m}:{m}:ro" for m in mounts]},
        "grafana": {"volumes": [f"{provisioning}:/etc/grafana/provisioning:ro"]},
    }}
    override_file = state_dir / "compose.override.yml"
    override_file.write_text(yaml.safe_dump(override, sort_keys=False))
    project = "rlvitals-" + hashlib.sha1(str(state_dir).encode()).hexdigest()[:8]
    password, generated = grafana_password()
    env = {**os.environ, "GF_SECURITY_ADMIN_PASSWORD": password,
           "RLVITALS_PROMETHEUS_PORT": str(args.prometheus_port), "RLVITALS_GRAFANA_PORT": str(args.grafana_port)}
    compose = ["docker", "compose", "-p", project, "-f", str(COMPOSE_FILE), "-f", str(override_file)]
    state = {"backend": "docker", "project": project, "compose": compose, "run_dirs": list(args.run_dir),
             "urls": {"prometheus": prom_url, "grafana": f"http://{HOST}:{args.grafana_port}"}}
    write_state(state_dir, state)
    result = subprocess.run(compose + ["up", "-d"], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        subprocess.run(compose + ["down"], env=env, capture_output=True)
        (state_dir / STATE_FILE).unlink(missing_ok=True)
        raise StackError(f"`docker compose up` failed: {(result.stderr or result.stdout).strip()[-800:]}", code=1)
    wait_ready(f"{prom_url}/-/ready", None, None, "Prometheus (docker)")
    say(f"Prometheus  {prom_url}  (alerts: {prom_url}/alerts)")
    for pattern in globs:
        say(f"  watching {pattern}")
    wait_ready(f"{state['urls']['grafana']}/api/health", None, None, "Grafana (docker)")
    say(f"Grafana     {state['urls']['grafana']}/d/rlvitals-overview  ({announce_password(password, generated)})")
    say(f"state in {state_dir}; stop with `rlvitals stack down{state_flag(args)}`")
    return 0


# ------------------------------------------------------------------ down, status
def down(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).expanduser().resolve()
    state = read_state(state_dir)
    if state is None:
        say(f"nothing to stop: no stack state in {state_dir}")
        return 0
    if state.get("backend") == "docker":
        env = {**os.environ, "GF_SECURITY_ADMIN_PASSWORD": "unused-by-down"}  # compose interpolates the whole file
        result = subprocess.run(state["compose"] + ["down"], env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise StackError(f"`docker compose down` failed: {(result.stderr or result.stdout).strip()[-800:]}",
                             code=1)
        say(f"stopped compose project {state['project']}")
    else:
        for record in reversed(state.get("processes", [])):
            if stop_process(record):
                say(f"stopped {record['name']} (pid {record['pid']})")
            else:
                say(f"{record['name']} (pid {record['pid']}) was no longer running")
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return 0


def status(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).expanduser().resolve()
    state = read_state(state_dir)
    if not running(state):
        say(f"the stack is down (state folder {state_dir})")
        return 1
    for name, url in state.get("urls", {}).items():
        say(f"{name:<11} {url}  {'up' if http_ok(url + ('/-/ready' if name == 'prometheus' else '/api/health')) else 'not answering'}")
    for d in state.get("run_dirs", []):
        say(f"watching {d}")
    return 0


# ------------------------------------------------------------------ CLI
def add_parser(sub) -> None:
    stack = sub.add_parser("stack", help="start or stop Prometheus (and Grafana) for watching runs, on loopback")
    actions = stack.add_subparsers(dest="action", required=True)
    state_help = f"folder for the stack's config, data, logs and pids (default {default_state_dir()})"
    up_p = actions.add_parser("up", help="start Prometheus (and Grafana where installed) and print their URLs")
    up_p.add_argument("--run-dir", action="append", default=[], metavar="DIR",
                      help="a run directory whose discovery/ folder Prometheus watches (repeatable; the run may "
                           "start later); running `up` again with new ones adds them")
    up_p.add_argument("--prometheus-port", type=int, default=9090, help="port on 127.0.0.1 (default 9090)")
    up_p.add_argument("--grafana-port", type=int, default=3000, help="port on 127.0.0.1 (default 3000)")
    up_p.add_argument("--backend", choices=("auto", "native", "docker"), default="auto",
                      help="native binaries or docker compose; auto: native when `prometheus` is installed, "
                           "else docker when available")
    up_p.add_argument("--scrape-interval", default=None, metavar="DURATION",
                      help="override deploy/prometheus's scrape interval (e.g. 1s for short runs)")
    for p in (up_p, actions.add_parser("down", help="stop what `stack up` started, nothing else"),
              actions.add_parser("status", help="show whether the stack is up and its URLs")):
        p.add_argument("--state-dir", default=str(default_state_dir()), help=state_help)


def run(args: argparse.Namespace) -> int:
    try:
        return {"up": up, "down": down, "status": status}[args.action](args)
    except StackError as exc:
        print(f"rlvitals: error: {exc}", file=sys.stderr)
        return exc.code
