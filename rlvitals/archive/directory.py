"""The run directory: what was run, how it went, and the weights it ended with.

Layout of a run directory:
  config.yaml     the resolved config (every field, after YAML and flags)
  meta.json       run id, command line, code version, package versions, host
  metrics.jsonl   one JSON row of metric values per update at first, then thinned (rlvitals/rows.py)
  summary.json    written once at the end
  checkpoints/    latest.pt, best.pt and the last keep_checkpoints update-<N>.pt (checkpoints.py)
  discovery/      file_sd target files of the run's live processes (`<component>-<pid>-<port>.json`)
  .lock           held (flock) by the one process writing the run; names its pid
  .space-reserve  room held while the run writes, given up for summary.json after a failed write (files.py)

Owner-only (folders 0700, files 0600) unless the run sets `group_readable` (0750 and
0640): meta.json names the host and the command line, checkpoints hold the weights.

One process at a time writes a run directory (lock.py), so a resume can remove
what earlier writers left behind (cleanup.py). Only named, non-secret facts go
into meta.json: never the process environment.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ..config_yaml import dump_yaml
from .checkpoints import BEST, CHECKPOINT_FORMAT, LATEST, place_as, prune_updates, read_checkpoint, update_file
from .cleanup import remove_dead_targets, remove_temporaries, trim_metrics
from .files import (
    ArchiveWriteError,
    LinkRefused,
    atomic_write_bytes,
    file_mode,
    folder_mode,
    hold_reserve,
    make_folder,
    refuse_links,
    release_reserve,
    set_tree_mode,
)
from .lock import lock_run_dir
from .provenance import code_version, package_versions


def default_run_dir(env_id: str, seed: int, parent: str = "runs") -> str:
    slug = env_id.split(":")[-1].replace("/", "-")
    return str(Path(parent) / f"{slug}-{time.strftime('%Y%m%d-%H%M%S')}-s{seed}")


def check_writable(run_dir: str) -> None:
    """Raise ValueError (one line) unless run_dir can be created fresh."""
    path = Path(run_dir)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"run_dir={run_dir!r} is invalid: it already exists and is not empty; "
                         "expected a new or empty directory")
    parent = path if path.exists() else next((p for p in path.parents if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise ValueError(f"run_dir={run_dir!r} is invalid: {str(parent)!r} is not writable")


_LAST: list = []
"""The run directory this process locked last (what a stop message reports on)."""


def last_archive() -> RunArchive | None:
    return _LAST[-1] if _LAST else None


class RunArchive:
    """A run directory. Writes that fail raise ArchiveWriteError once; after that the archive
    keeps what it can (summary.json, metrics rows) and attempts no further checkpoint, so the
    run ends with its last good checkpoint and one line saying what happened."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.folder_mode: int | None = None  # the run's permissions (files.folder_mode), set by create/note_resume
        self.keep_checkpoints = 0  # update-<N>.pt files kept (the config's keep_checkpoints), set likewise
        self.best: dict | None = None
        """What best.pt is: {"updates", "mean_return_last_100"} (None: no best.pt yet)."""
        self._metrics: int | None = None  # fd of metrics.jsonl, opened for appending
        self._lock_fd: int | None = None
        self.write_error: ArchiveWriteError | None = None
        self.last_checkpoint_updates: int | None = None
        self.checkpoints_written = 0
        self.summary_written = self.summary_failed = False
        self.rows_lost = 0
        self.not_written: list[str] = []
        """Files of the run's end that could not be written after the first failure (verdicts.json)."""

    def record_failure(self, error: ArchiveWriteError) -> None:
        """A write into the run directory by someone else (a row observer: TensorBoard's event file) failed:
        the run ends on it as on a failed write of its own (raised once, noted after)."""
        self._failed(error)

    def _failed(self, error: ArchiveWriteError) -> None:
        """Raise the first write failure; later ones (the run is ending because of it) are only noted."""
        if self.write_error is None:
            error.archive = self
            self.write_error = error
            raise error

    def lock(self) -> None:
        """Hold the run directory's lock until close() (or the end of this process). RunDirBusy if taken."""
        if self._lock_fd is None:
            self._lock_fd = lock_run_dir(self.path)
            try:
                refuse_links(self.path)  # checked with the lock held: no other rlvitals writer changes it now
            except LinkRefused:
                os.close(self._lock_fd)
                self._lock_fd = None
                raise
            _LAST[:] = [self]

    @classmethod
    def create(cls, run_dir: str, config: dict[str, Any], argv: list[str]) -> RunArchive:
        """A new run directory, locked, owner-only unless `config["group_readable"]`; config.yaml and meta.json."""
        archive = cls(run_dir)
        archive.folder_mode = folder_mode(bool(config.get("group_readable")))
        archive.keep_checkpoints = int(config.get("keep_checkpoints", 0))
        archive.path.parent.mkdir(parents=True, exist_ok=True)
        make_folder(archive.path, archive.folder_mode)
        archive.lock()
        hold_reserve(archive.path)
        make_folder(archive.path / "checkpoints", archive.folder_mode)
        meta = {
            "run_id": uuid.uuid4().hex[:12],
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": [Path(sys.argv[0]).name] + list(argv),
            "code_version": code_version(),
            "packages": package_versions(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "hostname": socket.gethostname(),
        }
        atomic_write_bytes(archive.path / "config.yaml", dump_yaml(config).encode())
        atomic_write_bytes(archive.path / "meta.json", json.dumps(meta, indent=2).encode())
        return archive

    def note_resume(self, argv: list[str], env_steps: int, config: dict[str, Any], updates: int | None = None,
                    best: dict | None = None) -> None:
        """Take the lock, put the directory back as the checkpoint left it, record the resume in meta.json
        (same run id) and the config it continues with.

        Back as the checkpoint left it: temporaries of interrupted writes and discovery files of
        the dead processes removed, metrics.jsonl cut to the rows up to the checkpoint's update
        (`updates`; where not given, its env steps), so update numbers never repeat; best.pt and
        update-<N>.pt as the checkpoint's own record (`best`) and keep_checkpoints say, in case the
        run was killed between writing latest.pt and placing them.
        """
        self.lock()
        hold_reserve(self.path)
        self.folder_mode = folder_mode(bool(config.get("group_readable")))
        set_tree_mode(self.path, self.folder_mode)  # the resumed run's setting, for what is there and what comes
        self.keep_checkpoints = int(config.get("keep_checkpoints", 0))
        self.last_checkpoint_updates = updates
        removed = self.remove_leftovers()
        if updates is not None:
            self._place_beside_latest(updates, is_best=bool(best) and best.get("updates") == updates)
        self.best = best
        rows_removed = trim_metrics(self.path / "metrics.jsonl", updates=updates, env_steps=env_steps)
        meta = self.meta
        meta.setdefault("resumes", []).append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                               "command": [Path(sys.argv[0]).name] + list(argv),
                                               "env_steps": env_steps, "code_version": code_version(),
                                               "metrics_rows_removed": rows_removed, "files_removed": removed})
        atomic_write_bytes(self.path / "meta.json", json.dumps(meta, indent=2).encode())
        atomic_write_bytes(self.path / "config.yaml", dump_yaml(config).encode())

    def remove_leftovers(self) -> list[str]:
        """Temporaries of interrupted atomic writes and every discovery file: only while holding the lock."""
        assert self._lock_fd is not None, "remove_leftovers needs the run directory's lock"
        return remove_temporaries(self.path) + remove_dead_targets(self.path / "discovery", everything=True)

    @property
    def meta(self) -> dict[str, Any]:
        """meta.json; OSError or ValueError (torn, too large, no regular file) when it cannot be read."""
        from ..limits import JSON_BYTES_MAX, read_bounded

        return json.loads(read_bounded(self.path / "meta.json", JSON_BYTES_MAX, "meta.json"))

    @property
    def run_id(self) -> str:
        if getattr(self, "_run_id", None) is None:
            self._run_id = str(self.meta["run_id"])
        return self._run_id

    @property
    def config(self) -> dict[str, Any]:
        from ..config import load_yaml

        return load_yaml(self.path / "config.yaml", what="config.yaml")

    def append_metrics(self, row: dict[str, Any]) -> None:
        """Append one row whole or not at all (a failed write is cut back, so no torn line stays)."""
        data = (json.dumps(row, allow_nan=False, default=float) + "\n").encode()
        path = self.path / "metrics.jsonl"
        size = 0
        try:
            if self._metrics is None:
                self._metrics = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                                        file_mode(self.path))
            size = os.fstat(self._metrics).st_size
            view = memoryview(data)
            while view:
                view = view[os.write(self._metrics, view):]
        except OSError as exc:
            if self._metrics is not None:
                try:
                    os.ftruncate(self._metrics, size)
                except OSError:
                    pass
            self.rows_lost += 1
            self._failed(ArchiveWriteError(path, len(data), exc, kept="the row cut back, the rows before it kept"))

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.write_error is not None:  # say in the summary itself why the archive is incomplete
            summary = {**summary, "archive_error": str(self.write_error)}
            release_reserve(self.path)  # the room held for this: summary.json and verdicts.json
        try:
            atomic_write_bytes(self.path / "summary.json", json.dumps(summary, indent=2).encode())
        except ArchiveWriteError as error:
            self.summary_failed = True
            self._failed(error)
            return
        self.summary_written = True

    def save_checkpoint(self, state: dict[str, Any], mean_return: float | None = None) -> Path:
        """Write latest.pt; then best.pt when `mean_return` (of the last 100 episodes) beats best.pt's, and
        update-<N>.pt, pruned to the newest keep_checkpoints (checkpoints.py). The checkpoint records
        which one best.pt is, so a resume goes on judging against it."""
        import io

        import torch

        path = self.path / "checkpoints" / f"{LATEST}.pt"
        if self.write_error is not None:
            return path  # a write already failed: the run is ending, the last good checkpoint stays as it is
        updates = (state.get("tracker") or {}).get("updates")
        record = self.best or {}
        is_best = (record.get("mean_return_last_100") is None
                   or record.get("updates") == updates  # the same update written again (the final checkpoint)
                   or (mean_return is not None and mean_return > record["mean_return_last_100"]))
        best = {"updates": updates, "mean_return_last_100": mean_return} if is_best else self.best
        buffer = io.BytesIO()
        torch.save({"format": CHECKPOINT_FORMAT, **state, "best": best}, buffer)
        data = buffer.getvalue()
        try:
            atomic_write_bytes(path, data)
            self.last_checkpoint_updates = updates
            self.checkpoints_written += 1
            self._place_beside_latest(updates, is_best, data)
        except ArchiveWriteError as error:
            self._failed(error)
            return path
        self.best = best
        return path

    def _place_beside_latest(self, updates: int, is_best: bool, data: bytes | None = None) -> None:
        """best.pt (when latest.pt is the best) and update-<N>.pt as latest.pt, then the old update files pruned."""
        folder = self.path / "checkpoints"
        latest = folder / f"{LATEST}.pt"
        if self.keep_checkpoints > 0:
            place_as(latest, folder / update_file(updates), data)
        if is_best:
            place_as(latest, folder / f"{BEST}.pt", data)
        prune_updates(folder, self.keep_checkpoints)

    def outcome(self) -> str:
        """What is on disk now, in words: the last checkpoint and whether summary.json was written."""
        if self.write_error is not None:
            return str(self.write_error)
        last = self.last_checkpoint_updates
        if self.checkpoints_written:
            text = f"checkpoint of update {last} written"
        elif last is not None:
            text = f"no checkpoint written by this process (the last one is of update {last})"
        else:
            text = "no checkpoint written (none was due yet)"
        summary = "summary.json written" if self.summary_written else "summary.json not written"
        return f"{text}, {summary}, run directory {self.path}"

    def load_checkpoint(self) -> dict[str, Any]:
        """latest.pt (what a resume reads); ValueError (one line) when it is missing or not a checkpoint."""
        path = self.path / "checkpoints" / f"{LATEST}.pt"
        if not path.exists() and not path.is_symlink():
            raise ValueError(f"run_dir={str(self.path)!r} has no checkpoint at {path}")
        return read_checkpoint(path)

    def close(self) -> None:
        """Close metrics.jsonl, remove discovery files of processes that are gone, set the run's permissions
        on everything in it, release the lock."""
        if self._metrics is not None:
            os.close(self._metrics)
            self._metrics = None
        if self._lock_fd is not None:
            release_reserve(self.path)
            remove_dead_targets(self.path / "discovery")
            if self.folder_mode is not None:  # files that libraries wrote with the umask (TensorBoard's) too
                set_tree_mode(self.path, self.folder_mode)
            os.close(self._lock_fd)
            self._lock_fd = None
