"""Putting a run directory back as its last checkpoint left it, for a resume.

What a killed run leaves behind: temporaries of interrupted atomic writes,
discovery files of its dead processes (Prometheus would show them `down`), and
metrics rows newer than the checkpoint (a resume would write those update
numbers again). Only the holder of the run directory's lock may remove them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .lock import pid_alive

TARGET_NAME = re.compile(r"^[A-Za-z_]+-(\d+)-\d+\.json$")
"""Discovery files a process writes for itself: <component>-<pid>-<port>.json."""


def remove_dead_targets(discovery: Path, everything: bool = False) -> list[str]:
    """Remove discovery files whose process is gone (all of them with `everything`); the names removed.

    Only `<component>-<pid>-<port>.json` files name their process; the others (Ray actors and
    node sidecars, written by the driver) go only with `everything`, which is for a process
    holding the run's lock: every earlier writer is dead then.
    """
    removed = []
    if discovery.is_symlink() or not discovery.is_dir():  # a link: its target's files are not ours to remove
        return removed
    for path in sorted(discovery.iterdir()):
        match = TARGET_NAME.match(path.name)
        stale = (everything and (path.suffix == ".json" or path.name.endswith(".tmp"))
                 or match is not None and int(match.group(1)) != os.getpid() and not pid_alive(int(match.group(1))))
        if stale and not path.is_symlink() and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(f"discovery/{path.name}")
    return removed


def remove_temporaries(run_dir: Path) -> list[str]:
    """Temporaries of interrupted atomic writes in the run directory and checkpoints/; the names removed."""
    removed = []
    for folder in (run_dir, run_dir / "checkpoints"):
        if folder.is_dir() and not folder.is_symlink():  # a link: its target's files are not ours to remove
            for path in sorted(folder.glob(".*.tmp")):
                if path.is_dir() and not path.is_symlink():
                    continue  # no temporary of ours is a folder
                path.unlink(missing_ok=True)
                removed.append(str(path.relative_to(run_dir)))
    return removed


def trim_metrics(path: Path, updates: int | None = None, env_steps: int | None = None) -> int:
    """Cut the metrics.jsonl at `path` after the last row at or before `updates` (or `env_steps`); rows removed.

    Rows are in update order, so this is a prefix; a torn last line (a kill mid-write) goes too.
    """
    if not path.is_file() or (updates is None and env_steps is None):
        return 0
    keep, lines, lines_kept, cut = 0, 0, 0, False
    with open(path, "rb") as fh:
        for line in fh:
            lines += 1
            if cut:
                continue
            try:
                row = json.loads(line) if line.endswith(b"\n") else None
            except ValueError:
                row = None
            newer = (row.get("updates", 0) > updates if updates is not None
                     else row.get("env_steps", 0) > env_steps) if isinstance(row, dict) else True
            if newer:
                cut = True
                lines_kept = lines - 1
                continue
            keep += len(line)
    if not cut:
        return 0
    with open(path, "r+b") as fh:
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    return lines - lines_kept
