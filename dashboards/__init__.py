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

REFERENCE_URL = "https://github.com/rlvitals/rlvitals/blob/main/docs/metrics.md"
"""Where panel links find the metric reference: docs/metrics.md in the project's repository (each link adds
`#<metric name>`, the anchor of that metric's section). Grafana serves no files of ours, and a file:// link
from a web page is blocked by browsers, so this is a web address; a fork or a mirror sets its own with
`python -m rlvitals.dashboards.generate --reference-url URL`, or per view with the hidden dashboard variable
`reference` (`?var-reference=URL`)."""

DASHBOARD_DIR = Path(str(resources.files(__name__)))
"""This package's folder, found through the import system: the checkout's dashboards/ or the installed copy."""


def dashboard_files() -> list[Path]:
    """The generated dashboard files, in a stable order."""
    return sorted(DASHBOARD_DIR.glob("*.json"))
