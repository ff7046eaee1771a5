"""What code and which packages wrote a run: for meta.json (named, non-secret facts only)."""

from __future__ import annotations

import json
import subprocess
from importlib import metadata, resources
from pathlib import Path
from typing import Any

PACKAGES = ("rlvitals", "torch", "gymnasium", "numpy", "ray", "prometheus-client", "nvidia-ml-py", "ale-py")


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
