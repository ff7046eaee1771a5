"""The native backend: the installed `prometheus` (and `grafana`) binaries as daemons on loopback."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import time
from pathlib import Path

from rlvitals.dashboards import DASHBOARD_DIR

from .common import HOST, StackError, announce_password, grafana_password, say, state_flag
from .render import default_scrape_interval, discovery_globs, grafana_ini, render_prometheus_config, render_provisioning
from .supervise import STATE_FILE, ours, spawn, stop_process, wait_ready, write_state
from .tools import INSTALL_GRAFANA, find_grafana


def up_native(args: argparse.Namespace, state_dir: Path, globs: list[str]) -> int:
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
        start_grafana(args, state_dir, state, prom_url, *grafana)
    say(f"state in {state_dir}; stop with `rlvitals stack down{state_flag(args)}`")
    return 0


def start_grafana(args: argparse.Namespace, state_dir: Path, state: dict, prom_url: str, prefix: list[str],
                  home: Path | None) -> None:
    """Grafana with provisioning rendered for this Prometheus, a fresh database and the password in its env."""
    g_dir = state_dir / "grafana"
    if (g_dir / "data").exists():
        shutil.rmtree(g_dir / "data")  # a fresh database: the password below is the one in force
    scrape = args.scrape_interval or default_scrape_interval()
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


def watch_more(state_dir: Path, state: dict, new: list[str]) -> None:
    """Add run folders to a running native stack: re-render its config and have Prometheus re-read it."""
    state["run_dirs"] = state.get("run_dirs", []) + new
    globs = discovery_globs(state["run_dirs"], state_dir)
    (state_dir / "prometheus" / "prometheus.yml").write_text(
        render_prometheus_config(globs, state.get("scrape_interval")))
    record = next(r for r in state["processes"] if r["name"] == "prometheus")
    proc = ours(record)
    if proc is None:
        raise StackError("the stack's Prometheus is gone; run `rlvitals stack down` then `rlvitals stack up`",
                         code=1)
    proc.send_signal(signal.SIGHUP)  # Prometheus re-reads its configuration
    write_state(state_dir, state)
    for d in new:
        say(f"now also watching {Path(d).expanduser().resolve() / 'discovery' / '*.json'}")
