"""Tool discovery: which of Prometheus, Grafana and Docker are installed, and which backend `up` uses."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .common import StackError

INSTALL_PROMETHEUS = ("install it with `sudo apt-get install prometheus` (Debian/Ubuntu; `bash deploy/setup.sh --test` "
                      "does this) or from https://prometheus.io/download/")
INSTALL_GRAFANA = ("install it from https://grafana.com/grafana/download (Debian/Ubuntu: add the APT repository "
                   "https://apt.grafana.com, then `sudo apt-get install grafana`)")
INSTALL_DOCKER = "install Docker Engine and its compose plugin: https://docs.docker.com/engine/install/"


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


def choose_backend(requested: str) -> str:
    """`native` or `docker` for `--backend requested` (auto: native where Prometheus is installed)."""
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
