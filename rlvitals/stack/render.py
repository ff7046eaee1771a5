"""The files `stack up` gives Prometheus and Grafana: copies of the shipped configuration, rendered for this stack.

The originals ship inside the package (deploy/ is the data package
`rlvitals.deploy`, dashboards/ is `rlvitals.dashboards`) and are found through
the import system, so a wheel installed anywhere finds them as a checkout does.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import yaml

from .common import HOST


def package_folder(package: str) -> Path:
    """The folder of a package installed as plain files (as pip installs), where servers can read files by path."""
    folder = resources.files(package)
    if not isinstance(folder, Path):
        raise ImportError(f"{package} is not installed as plain files ({folder!s}); install rlvitals with pip")
    return folder


DEPLOY = package_folder("rlvitals.deploy")
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
RULES_DIR = DEPLOY / "prometheus" / "rules"
PROVISIONING = DEPLOY / "grafana" / "provisioning"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"


def default_scrape_interval() -> str:
    """The scrape interval of the shipped prometheus.yml."""
    return yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]


def discovery_globs(run_dirs: list[str], state_dir: Path) -> list[str]:
    """The file_sd patterns the rlvitals job watches: each run's discovery folder, then the state's targets/."""
    globs = [str(Path(d).expanduser().resolve() / "discovery" / "*.json") for d in run_dirs]
    return list(dict.fromkeys(globs + [str(state_dir / "targets" / "*.json")]))


def render_prometheus_config(globs: list[str], scrape_interval: str | None = None,
                             rules_dir: Path = RULES_DIR) -> str:
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
    header = f"# Rendered by `rlvitals stack up` from {PROMETHEUS_CONFIG}; edits here are overwritten.\n"
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
