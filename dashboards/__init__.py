"""Grafana dashboards generated from the telemetry catalogue.

`generate` builds the dashboard JSON files in this folder from
`rlvitals.telemetry.catalogue` (run `python -m rlvitals.dashboards.generate`,
or with `--check` to fail when a committed file is out of date): `panels`
makes a panel from catalogue metrics, `content` lists the panels of each
dashboard, `grafana` writes Grafana's JSON model, and `healthy` shades each
panel where the health rules fire and where the catalogue says healthy. The JSON
files are package data: `rlvitals dashboards push` and `rlvitals stack up`
read them from here.

May import: `rlvitals.telemetry` (the catalogue, the bands, the health rules) and the standard library.
"""

from importlib import resources
from pathlib import Path

DASHBOARD_DIR = Path(str(resources.files(__name__)))
"""This package's folder, found through the import system: the checkout's dashboards/ or the installed copy."""


def dashboard_files() -> list[Path]:
    """The generated dashboard files, in a stable order."""
    return sorted(DASHBOARD_DIR.glob("*.json"))
