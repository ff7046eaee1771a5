"""Real conditions a test puts a run directory in: a folder this user cannot read, a read-only mount.

Each says why it cannot be made on this machine (`unavailable`), so a test skips with that reason
instead of passing without the condition. Used by tests/test_bad_inputs.py and tests/test_fault_lines.py.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

DROP_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                 "--bounding-set=-dac_override,-dac_read_search"]
"""For root: a command prefix without the capabilities that let root read a mode-000 folder."""


@functools.cache
def _override_dropped_reason() -> str | None:
    """Why mode 000 cannot be made to hold for a command here (None: it can)."""
    if os.geteuid() != 0:
        return None
    if shutil.which("setpriv") is None:
        return "running as root, which reads mode-000 folders, and setpriv (util-linux) is missing to drop that"
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0)
        probe = subprocess.run([*DROP_OVERRIDE, "ls", tmp], capture_output=True)
    if probe.returncode == 0:
        return "running as root, and setpriv cannot drop CAP_DAC_OVERRIDE here: mode 000 is not honoured"
    return None


@functools.cache
def _mount_reason() -> str | None:
    """Why a read-only bind mount cannot be made here (None: it can)."""
    with tempfile.TemporaryDirectory() as tmp:
        made = subprocess.run(["mount", "--bind", tmp, tmp], capture_output=True, text=True)
        if made.returncode != 0:
            return (f"cannot bind-mount ({made.stderr.strip() or 'mount failed'}); a read-only run directory "
                    "needs root or CAP_SYS_ADMIN")
        subprocess.run(["umount", "-l", tmp], capture_output=True)
    return None


class Unreadable:
    """The folder `relative` (inside the path given) at mode 000, and the command run where that is honoured."""

    def __init__(self, relative: str = "."):
        self.relative = relative

    def unavailable(self) -> str | None:
        return _override_dropped_reason()

    def apply(self, path: Path) -> list[str]:
        os.chmod(path / self.relative, 0)
        return DROP_OVERRIDE if os.geteuid() == 0 else []

    def undo(self, path: Path) -> None:
        os.chmod(path / self.relative, 0o700)


class ReadOnlyMount:
    """The path given bind-mounted onto itself read-only (EROFS for every write, root's too)."""

    def unavailable(self) -> str | None:
        return _mount_reason()

    def apply(self, path: Path) -> list[str]:
        subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        return []

    def undo(self, path: Path) -> None:
        subprocess.run(["umount", "-l", str(path)], check=True)
