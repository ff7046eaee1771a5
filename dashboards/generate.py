"""Build the Grafana dashboards from the telemetry catalogue.

    python -m rlvitals.dashboards.generate            # (re)write dashboards/*.json
    python -m rlvitals.dashboards.generate --check    # exit 1 if a committed file is stale

The catalogue is the single source. The work is split in three modules:
`panels` makes a panel from catalogue metrics and a view (the title, help,
unit and query come from the catalogue), `content` says which panels are on
each dashboard, and `grafana` turns a dashboard into Grafana's JSON model.
This module renders every dashboard, writes or checks the files, and refuses
a catalogue metric that is on no dashboard, so a new metric cannot be forgotten.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlvitals.telemetry.catalogue import METRICS

from . import DASHBOARD_DIR, REFERENCE_URL
from .content import DASHBOARDS
from .grafana import build
from .panels import CatalogueError

OUT_DIR = DASHBOARD_DIR


def render_all(reference_url: str = REFERENCE_URL) -> dict[str, str]:
    """File name -> JSON text of every dashboard; raises CatalogueError if a catalogue metric is on none."""
    rendered, placed = {}, set()
    for name, make in DASHBOARDS.items():
        spec = make()
        for row in spec.rows:
            for panel in row.panels:
                placed.update(panel.metrics)
        rendered[f"{name}.json"] = json.dumps(build(spec, reference_url), indent=2) + "\n"
    missing = [m.name for m in METRICS if m.name not in placed]
    if missing:
        raise CatalogueError(f"catalogue metrics on no dashboard: {', '.join(missing)}; add each to a panel in "
                             "dashboards/content.py")
    return rendered


def stale_files(out_dir: Path = OUT_DIR, reference_url: str = REFERENCE_URL) -> list[str]:
    """Dashboard files that differ from what the catalogue generates (or are missing, or are extra)."""
    rendered = render_all(reference_url)
    stale = [name for name, text in rendered.items()
             if not (out_dir / name).is_file() or (out_dir / name).read_text() != text]
    stale += [p.name for p in sorted(out_dir.glob("*.json")) if p.name not in rendered]
    return stale


def write_all(out_dir: Path = OUT_DIR, reference_url: str = REFERENCE_URL) -> list[Path]:
    rendered = render_all(reference_url)
    for extra in out_dir.glob("*.json"):
        if extra.name not in rendered:
            extra.unlink()
    paths = []
    for name, text in rendered.items():
        path = out_dir / name
        path.write_text(text)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlvitals.dashboards.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed dashboard file is out of date")
    parser.add_argument("--dir", type=Path, default=OUT_DIR, help=f"folder of the dashboard files (default {OUT_DIR})")
    parser.add_argument("--reference-url", default=REFERENCE_URL,
                        help=f"address of docs/metrics.md that panel links open (default {REFERENCE_URL})")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_files(args.dir, args.reference_url)
            if stale:
                print(f"dashboards out of date: {', '.join(stale)}; run `python -m rlvitals.dashboards.generate`",
                      file=sys.stderr)
                return 1
            print("dashboards are up to date")
            return 0
        for path in write_all(args.dir, args.reference_url):
            print(f"wrote {path}")
    except CatalogueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
