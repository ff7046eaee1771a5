"""Process supervision: the state folder's record of what `up` started, starting and stopping daemons, readiness.

A process is recorded with its pid and start time, and is only ever signalled
while both still match: `down` stops exactly what `up` started, nothing else.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from .common import HOST, StackError

STATE_FILE = "state.json"
READY_TIMEOUT = 60.0


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


def ours(record: dict):
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
    return any(ours(r) is not None for r in state.get("processes", []))


# ------------------------------------------------------------------ readiness
def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
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


# ------------------------------------------------------------------ start, stop
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

    proc = ours(record)
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
