"""One writer per run directory: an exclusive `flock` on `<run_dir>/.lock`.

The kernel releases the lock when its process ends however it ends, so whoever
holds it knows every earlier writer is gone.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..config import ConfigError

LOCK_NAME = ".lock"


class RunDirBusy(ConfigError):
    """Another live process holds the run directory's lock; the message names its pid."""


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
