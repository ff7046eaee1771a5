"""The run directory: what was run, how it went, and the weights it ended with.

Layout of a run directory:
  config.yaml     the resolved config (every field, after YAML and flags)
  meta.json       run id, command line, code version, package versions, host
  metrics.jsonl   one JSON row of metric values per update at first, then thinned (rlvitals/rows.py)
  summary.json    written once at the end
  checkpoints/    latest.pt (atomic: temp file, fsync, rename)
  discovery/      file_sd target files of the run's live processes (`<component>-<pid>-<port>.json`)
  .lock           held (flock) by the one process writing the run; names its pid

One process at a time writes a run directory: it holds an exclusive `flock`
on `.lock`, which the kernel releases when the process ends however it ends.
So whoever holds the lock knows every other writer is gone, and a resume can
remove what they left behind: temporary files of interrupted writes,
discovery files of dead processes, metrics rows newer than the checkpoint.

Only named, non-secret facts go into meta.json: never the process environment.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import platform
import socket
import subprocess
import sys
import time
import uuid
import warnings
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError

PACKAGES = ("rlvitals", "torch", "gymnasium", "numpy", "ray", "prometheus-client", "nvidia-ml-py", "ale-py")
CHECKPOINT_FORMAT = "rlvitals-checkpoint-v1"
CHECKPOINT_KEYS = ("config", "network", "optimizer", "age", "tracker", "learner", "rng")
"""What every checkpoint holds (later versions add keys; none of these go)."""
LOCK_NAME = ".lock"
TARGET_NAME = re.compile(r"^[A-Za-z_]+-(\d+)-\d+\.json$")
"""Discovery files a process writes for itself: <component>-<pid>-<port>.json."""


class RunDirBusy(ConfigError):
    """Another live process holds the run directory's lock; the message names its pid."""


def code_version() -> dict[str, Any]:
    """What code is running: from git where rlvitals runs from a checkout, else from the installed package's metadata.

    `version` is the package version; `commit` the checkout's HEAD (`dirty`: tracked files differ from it), or for an
    install from a git URL the commit pip recorded (PEP 610 direct_url.json), else "unknown"; `source` says which.
    """
    try:
        dist = metadata.distribution("rlvitals")
        version = dist.version
    except metadata.PackageNotFoundError:
        dist, version = None, "unknown"
    root = Path(str(resources.files("rlvitals"))).parent
    if (root / "pyproject.toml").is_file():  # a source tree (checkout, editable install), not site-packages
        try:
            commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                    text=True, timeout=5).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=5).stdout.strip() != ""
        except (OSError, subprocess.SubprocessError):
            commit, dirty = "", False
        if commit:
            return {"commit": commit, "dirty": dirty, "version": version, "source": "git"}
    try:
        direct = json.loads((dist.read_text("direct_url.json") if dist else None) or "{}")
    except json.JSONDecodeError:
        direct = {}
    commit = direct.get("vcs_info", {}).get("commit_id") or "unknown"
    return {"commit": commit, "dirty": False, "version": version, "source": "metadata"}


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


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


def lock_run_dir(path: Path, write_pid: bool = True) -> int:
    """Take the run directory's exclusive lock; the open descriptor holds it. RunDirBusy when taken."""
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirBusy(f"run_dir={str(path)!r} is in use by process {holder} (it holds {path / LOCK_NAME}); "
                         "expected a run directory no other process is writing") from None
    if write_pid:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def check_not_busy(path: Path) -> None:
    """RunDirBusy when a live process holds the run directory's lock; takes nothing itself."""
    lock_file = path / LOCK_NAME
    if not lock_file.is_file():
        return
    os.close(lock_run_dir(path, write_pid=False))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_targets(discovery: Path, everything: bool = False) -> list[str]:
    """Remove discovery files whose process is gone (all of them with `everything`); the names removed.

    Only `<component>-<pid>-<port>.json` files name their process; the others (Ray actors and
    node sidecars, written by the driver) go only with `everything`, which is for a process
    holding the run's lock: every earlier writer is dead then.
    """
    removed = []
    if not discovery.is_dir():
        return removed
    for path in sorted(discovery.iterdir()):
        match = TARGET_NAME.match(path.name)
        stale = (everything and (path.suffix == ".json" or path.name.endswith(".tmp"))
                 or match is not None and int(match.group(1)) != os.getpid() and not pid_alive(int(match.group(1))))
        if stale and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(f"discovery/{path.name}")
    return removed


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
"""Errors that mean "no room": a full filesystem, a quota, a file-size limit (RLIMIT_FSIZE)."""


class ArchiveWriteError(RuntimeError):
    """Writing into the run directory failed (full disk, quota, file-size limit, I/O error).

    The message is one line: the path, the bytes it needed and the space left, what was
    cleaned up and kept, whether summary.json got written, and how to go on. It is
    composed when shown, so it says how the rest of the archive fared after the failure.
    """

    def __init__(self, path: Path, size: int, error: OSError):
        super().__init__(str(path))
        self.path, self.size, self.error = Path(path), size, error
        self.archive: RunArchive | None = None
        try:
            self.free = shutil.disk_usage(self.path.parent).free
        except OSError:
            self.free = None

    @property
    def no_space(self) -> bool:
        return self.error.errno in NO_SPACE

    def __str__(self) -> str:
        what = "no space left" if self.no_space else (self.error.strerror or type(self.error).__name__).lower()
        free = f", {_size(self.free)} free there" if self.free is not None else ""
        text = f"{what} writing {self.path} ({_size(self.size)} needed{free}): temporary file removed"
        archive = self.archive
        if archive is None:
            return text
        last = archive.last_checkpoint_updates
        text += (f", last good checkpoint (update {last}) kept" if last is not None
                 else ", last good checkpoint (if any) kept")
        if archive.summary_written:
            text += ", summary.json written"
        elif archive.summary_failed:
            text += ", summary.json could not be written either"
        if archive.rows_lost:
            text += f", {archive.rows_lost} metrics rows not written"
        return text + f"; free space, then continue with: rlvitals train --resume {archive.path}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: temp file, fsync, rename, fsync of the folder.

    ArchiveWriteError when it cannot be written (the temp file is removed, `path` is untouched).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException as exc:  # a failed write, or a stop arriving mid-write: no temporary file stays
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise ArchiveWriteError(path, len(data), exc) from None
        raise


_LAST: list = []
"""The run directory this process locked last (what a stop message reports on)."""


def last_archive() -> "RunArchive | None":
    return _LAST[-1] if _LAST else None


class RunArchive:
    """A run directory. Writes that fail raise ArchiveWriteError once; after that the archive
    keeps what it can (summary.json, metrics rows) and attempts no further checkpoint, so the
    run ends with its last good checkpoint and one line saying what happened."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._metrics: int | None = None  # fd of metrics.jsonl, opened for appending
        self._lock_fd: int | None = None
        self.write_error: ArchiveWriteError | None = None
        self.last_checkpoint_updates: int | None = None
        self.checkpoints_written = 0
        self.summary_written = self.summary_failed = False
        self.rows_lost = 0

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
            _LAST[:] = [self]

    @classmethod
    def create(cls, run_dir: str, config: dict[str, Any], argv: list[str]) -> "RunArchive":
        archive = cls(run_dir)
        archive.path.mkdir(parents=True, exist_ok=True)
        archive.lock()
        (archive.path / "checkpoints").mkdir(exist_ok=True)
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
        atomic_write_bytes(archive.path / "config.yaml", yaml.safe_dump(config, sort_keys=True).encode())
        atomic_write_bytes(archive.path / "meta.json", json.dumps(meta, indent=2).encode())
        return archive

    def note_resume(self, argv: list[str], env_steps: int, config: dict[str, Any], updates: int | None = None) -> None:
        """Take the lock, put the directory back as the checkpoint left it, record the resume in meta.json
        (same run id) and the config it continues with.

        Back as the checkpoint left it: temporaries of interrupted writes and discovery files of
        the dead processes removed, metrics.jsonl cut to the rows up to the checkpoint's update
        (`updates`; where not given, its env steps), so update numbers never repeat.
        """
        self.lock()
        self.last_checkpoint_updates = updates
        removed = self.remove_leftovers()
        rows_removed = self.trim_metrics(updates=updates, env_steps=env_steps)
        meta = self.meta
        meta.setdefault("resumes", []).append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                               "command": [Path(sys.argv[0]).name] + list(argv),
                                               "env_steps": env_steps, "code_version": code_version(),
                                               "metrics_rows_removed": rows_removed, "files_removed": removed})
        atomic_write_bytes(self.path / "meta.json", json.dumps(meta, indent=2).encode())
        atomic_write_bytes(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=True).encode())

    def remove_leftovers(self) -> list[str]:
        """Temporaries of interrupted atomic writes and every discovery file: only while holding the lock."""
        assert self._lock_fd is not None, "remove_leftovers needs the run directory's lock"
        removed = []
        for folder in (self.path, self.path / "checkpoints"):
            if folder.is_dir():
                for path in sorted(folder.glob(".*.tmp")):
                    path.unlink(missing_ok=True)
                    removed.append(str(path.relative_to(self.path)))
        return removed + remove_dead_targets(self.path / "discovery", everything=True)

    def trim_metrics(self, updates: int | None = None, env_steps: int | None = None) -> int:
        """Cut metrics.jsonl after the last row at or before `updates` (or `env_steps`); rows removed.

        Rows are in update order, so this is a prefix; a torn last line (a kill mid-write) goes too.
        """
        path = self.path / "metrics.jsonl"
        if not path.is_file() or (updates is None and env_steps is None):
            return 0
        keep, lines, cut = 0, 0, False
        with open(path, "rb") as fh:
            for line in fh:
                lines += 1
                if cut:
                    continue
                try:
                    row = json.loads(line) if line.endswith(b"\n") else None
                except ValueError:
                    row = None
                if not isinstance(row, dict) or (
                        row.get("updates", 0) > updates if updates is not None else row.get("env_steps", 0) > env_steps):
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

    @property
    def meta(self) -> dict[str, Any]:
        return json.loads((self.path / "meta.json").read_text())

    @property
    def run_id(self) -> str:
        if getattr(self, "_run_id", None) is None:
            self._run_id = str(self.meta["run_id"])
        return self._run_id

    @property
    def config(self) -> dict[str, Any]:
        return yaml.safe_load((self.path / "config.yaml").read_text())

    def append_metrics(self, row: dict[str, Any]) -> None:
        """Append one row whole or not at all (a failed write is cut back, so no torn line stays)."""
        data = (json.dumps(row, allow_nan=False, default=float) + "\n").encode()
        path = self.path / "metrics.jsonl"
        size = 0
        try:
            if self._metrics is None:
                self._metrics = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
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
            self._failed(ArchiveWriteError(path, len(data), exc))

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.write_error is not None:  # say in the summary itself why the archive is incomplete
            summary = {**summary, "archive_error": str(self.write_error)}
        try:
            atomic_write_bytes(self.path / "summary.json", json.dumps(summary, indent=2).encode())
        except ArchiveWriteError as error:
            self.summary_failed = True
            self._failed(error)
            return
        self.summary_written = True

    def save_checkpoint(self, state: dict[str, Any]) -> Path:
        import io

        import torch

        path = self.path / "checkpoints" / "latest.pt"
        if self.write_error is not None:
            return path  # a write already failed: the run is ending, the last good checkpoint stays as it is
        buffer = io.BytesIO()
        torch.save({"format": CHECKPOINT_FORMAT, **state}, buffer)
        try:
            atomic_write_bytes(path, buffer.getvalue())
        except ArchiveWriteError as error:
            self._failed(error)
            return path
        self.last_checkpoint_updates = (state.get("tracker") or {}).get("updates")
        self.checkpoints_written += 1
        return path

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
        import torch

        path = self.path / "checkpoints" / "latest.pt"
        try:
            with warnings.catch_warnings():  # torch's remarks on foreign pickles: the one line below says it all
                warnings.simplefilter("ignore")
                state = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise ValueError(f"run_dir={str(self.path)!r} has no checkpoint at {path}") from None
        except IsADirectoryError:
            raise ValueError(f"checkpoint {str(path)!r} is a directory, not an rlvitals checkpoint") from None
        except Exception:  # torn, foreign, or holding objects other than tensors and plain data (never unpickled)
            raise ValueError(f"checkpoint {str(path)!r} is not an rlvitals checkpoint: it is truncated, corrupt, "
                             "or holds objects other than tensors and plain data, which are never loaded") from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"checkpoint {str(path)!r} is not an rlvitals checkpoint")
        missing = [key for key in CHECKPOINT_KEYS if key not in state]
        if missing:
            raise ValueError(f"checkpoint {str(path)!r} is incomplete: it lacks {', '.join(missing)}")
        return state

    def close(self) -> None:
        """Close metrics.jsonl, remove discovery files of processes that are gone, release the lock."""
        if self._metrics is not None:
            os.close(self._metrics)
            self._metrics = None
        if self._lock_fd is not None:
            remove_dead_targets(self.path / "discovery")
            os.close(self._lock_fd)
            self._lock_fd = None
