"""The docker backend: Prometheus and Grafana through `docker compose` (deploy/docker-compose.yml).

An override file mounts the rendered prometheus.yml, the run folders to watch
(read-only, at the same paths) and the rendered Grafana provisioning; the
project name is derived from the state folder so `down` stops only these
containers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
from pathlib import Path

import yaml

from .common import HOST, StackError, announce_password, grafana_password, say, state_flag
from .render import COMPOSE_FILE, default_scrape_interval, render_prometheus_config, render_provisioning
from .supervise import STATE_FILE, wait_ready, write_state

DASHBOARDS_IN_CONTAINER = "/var/lib/rlvitals/dashboards"
RULES_IN_CONTAINER = Path("/etc/prometheus/rules")


def up_docker(args: argparse.Namespace, state_dir: Path, globs: list[str]) -> int:
    """Both services through `docker compose`, with an override for the runs to watch and the ports."""
    prom_dir = state_dir / "prometheus"
    prom_dir.mkdir(exist_ok=True)
    config = prom_dir / "prometheus.yml"
    config.write_text(render_prometheus_config(globs, args.scrape_interval, rules_dir=RULES_IN_CONTAINER))
    prom_url = f"http://{HOST}:{args.prometheus_port}"
    scrape = args.scrape_interval or default_scrape_interval()
    provisioning = render_provisioning(state_dir / "grafana" / "provisioning", prom_url, scrape,
                                       DASHBOARDS_IN_CONTAINER)
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


def down_docker(state: dict) -> None:
    env = {**os.environ, "GF_SECURITY_ADMIN_PASSWORD": "unused-by-down"}  # compose interpolates the whole file
    result = subprocess.run(state["compose"] + ["down"], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"`docker compose down` failed: {(result.stderr or result.stdout).strip()[-800:]}", code=1)
    say(f"stopped compose project {state['project']}")
