"""The run directory: what was run, how it went, and the weights it ended with.

Layout of a run directory:
  config.yaml     the resolved config (every field, after YAML and flags)
  meta.json       run id, command line, code version, package versions, host
  metrics.jsonl   one JSON row of metric values per update at first, then thinned (rlvitals/rows.py)
  summary.json    written once at the end
  checkpoints/    latest.pt (atomic: temp file, fsync, rename)

Only named, non-secret facts go into meta.json: never the process environment.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import yaml

PACKAGES = ("rlvitals", "torch", "gymnasium", "numpy", "ray", "prometheus-client", "nvidia-ml-py", "ale-py")
CHECKPOINT_FORMAT = "rlvitals-checkpoint-v1"


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


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
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


class RunArchive:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._metrics = None

    @classmethod
    def create(cls, run_dir: str, config: dict[str, Any], argv: list[str]) -> "RunArchive":
        archive = cls(run_dir)
        archive.path.mkdir(parents=True, exist_ok=True)
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

    def note_resume(self, argv: list[str], env_steps: int, config: dict[str, Any]) -> None:
        """Record a resume in meta.json (same run id) and the config it continues with."""
        meta = self.meta
        meta.setdefault("resumes", []).append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                               "command": [Path(sys.argv[0]).name] + list(argv),
                                               "env_steps": env_steps, "code_version": code_version()})
        atomic_write_bytes(self.path / "meta.json", json.dumps(meta, indent=2).encode())
        atomic_write_bytes(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=True).encode())

    @property
    def meta(self) -> dict[str, Any]:
        return json.loads((self.path / "meta.json").read_text())

    @property
    def config(self) -> dict[str, Any]:
        return yaml.safe_load((self.path / "config.yaml").read_text())

    def append_metrics(self, row: dict[str, Any]) -> None:
        if self._metrics is None:
            self._metrics = open(self.path / "metrics.jsonl", "a", buffering=1)
        self._metrics.write(json.dumps(row, allow_nan=False, default=float) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_bytes(self.path / "summary.json", json.dumps(summary, indent=2).encode())

    def save_checkpoint(self, state: dict[str, Any]) -> Path:
        import io

        import torch

        buffer = io.BytesIO()
        torch.save({"format": CHECKPOINT_FORMAT, **state}, buffer)
        path = self.path / "checkpoints" / "latest.pt"
        atomic_write_bytes(path, buffer.getvalue())
        return path

    def load_checkpoint(self) -> dict[str, Any]:
        import torch

        path = self.path / "checkpoints" / "latest.pt"
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise ValueError(f"run_dir={str(self.path)!r} has no checkpoint at {path}") from None
        except Exception as exc:  # unpickling of anything but tensors and plain data is refused
            raise ValueError(f"checkpoint {str(path)!r} is not an rlvitals checkpoint: {exc}") from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"checkpoint {str(path)!r} is not an rlvitals checkpoint")
        return state

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
