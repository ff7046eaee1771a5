"""See a run: the offline report page, TensorBoard event files, and the end-of-run summary.

    rlvitals report RUN_DIR [RUN_DIR ...] [-o report.html]
    rlvitals export tensorboard RUN_DIR
    rlvitals train --tensorboard ...

`build_report` writes the page (`page` assembles it, `figures` draws one
plotly figure per dashboard panel, `signals` maps metrics.jsonl keys to the
catalogue and gives each its healthy bands, `rundata` reads a run directory in
any state). `tensorboard` holds the row observer and the exporter; `summary`
formats the lines printed at the end of a run.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..archive.files import ArchiveWriteError, atomic_write_bytes
from .rundata import ReportError, load_run, unique_names
from .signals import bands_for
from .summary import format_run_summary

__all__ = ["ReportError", "bands_for", "build_report", "default_output", "format_run_summary"]

MULTI_RUN_DEFAULT = "report.html"
"""Output of a report of several runs when -o is not given (in the current directory)."""


def default_output(run_dirs: list[str]) -> Path:
    return Path(run_dirs[0]) / "report.html" if len(run_dirs) == 1 else Path(MULTI_RUN_DEFAULT)


def check_output(output: Path) -> None:
    parent = output.parent if str(output.parent) else Path(".")
    if output.is_dir():
        raise ReportError(f"-o {str(output)!r} is invalid: it is a directory; expected an HTML file path")
    if not parent.is_dir():
        raise ReportError(f"-o {str(output)!r} is invalid: directory {str(parent)!r} does not exist; "
                          "expected a file in an existing directory")
    if not os.access(parent, os.W_OK):
        raise ReportError(f"-o {str(output)!r} is invalid: directory {str(parent)!r} is not writable")


def build_report(run_dirs: list[str], output: str | Path | None = None) -> tuple[Path, int]:
    """Write the report of one or more runs; returns (path written, bytes). Raises ReportError on bad input."""
    from .page import render

    runs = [load_run(d) for d in run_dirs]  # every directory is checked before anything is written
    out = Path(output) if output else default_output(run_dirs)
    check_output(out)
    unique_names(runs)
    data = render(runs).encode()
    try:
        atomic_write_bytes(out, data)  # whole or not at all, never through a link, with its folder's permissions
    except ArchiveWriteError as exc:
        if exc.no_space:
            raise  # one line saying how much was needed and how much is free (exit 1, as a run's full disk)
        raise ReportError(f"-o {str(out)!r} is unusable ({exc.error.strerror or exc.error}); expected a writable "
                          "HTML file path") from None
    return out, len(data)
