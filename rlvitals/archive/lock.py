"""One writer per run directory: an exclusive `flock` on `<run_dir>/.lock`.

The kernel releases the lock when its process ends however it ends, so whoever
holds it knows every earlier writer is gone, and a reader that finds it held knows
a writer is alive (`held_by_live_process`: how `rlvitals runs` tells running from crashed).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path

from ..config import ConfigError

LOCK_NAME = ".lock"
PROBE_WAIT_SECONDS = 0.5
"""How long a writer retries a lock that is taken: a reader's probe holds it for microseconds."""


class RunDirBusy(ConfigError):
    """Another live process holds the run directory's lock; the message names its pid."""


class LockRefused(ConfigError):
    """The run directory's `.lock` is not a lock file rlvitals made: a link, a FIFO, a folder."""


class RunDirUnwritable(ConfigError):
    """The run directory cannot be written (a read-only mount, no write permission): bad input, one line."""


UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM}


def open_lock(path: Path, flags: int) -> int:
    """The lock file's descriptor, never through a link (a run directory may come from anyone: a `.lock`
    linked to another file would have that file truncated); LockRefused for anything but a plain file."""
    lock_file = path / LOCK_NAME
    expected = f"expected a plain file (remove {lock_file} if no rlvitals process uses the run)"
    try:
        fd = os.open(lock_file, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in UNWRITABLE and flags & os.O_RDWR:
            raise RunDirUnwritable(f"run_dir={str(path)!r} is invalid: the run directory is not writable "
                                   f"({exc.strerror}: {lock_file}); expected a run directory this user may "
                                   "write (not a read-only mount)") from None
        kind = {errno.ELOOP: "a symbolic link", errno.EISDIR: "a directory"}.get(exc.errno)
        if kind is None:
            raise
        raise LockRefused(f"run_dir={str(path)!r} is invalid: its {LOCK_NAME} is {kind}; {expected}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        what = "a file with other names (hard links)" if stat.S_ISREG(info.st_mode) else "not a regular file"
        raise LockRefused(f"run_dir={str(path)!r} is invalid: its {LOCK_NAME} is {what}; {expected}")
    return fd


def lock_run_dir(path: Path, write_pid: bool = True) -> int:
    """Take the run directory's exclusive lock; the open descriptor holds it. RunDirBusy when taken,
    LockRefused when `.lock` is a link or no plain file."""
    fd = open_lock(path, os.O_RDWR | os.O_CREAT)
    try:
        _lock_soon(fd)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirBusy(f"run_dir={str(path)!r} is in use by process {holder} (it holds {path / LOCK_NAME}); "
                         "expected a run directory no other process is writing") from None
    if write_pid:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _lock_soon(fd: int) -> None:
    """The exclusive lock, retried for PROBE_WAIT_SECONDS; BlockingIOError if a writer keeps it."""
    deadline = time.monotonic() + PROBE_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)


def held_by_live_process(path: Path) -> bool:
    """Whether a live process holds the run directory's lock (a writer is running); takes nothing that stays.

    A shared lock, taken and dropped at once, cannot be had while a writer holds the exclusive one.
    """
    try:
        fd = open_lock(path, os.O_RDONLY)
    except (OSError, LockRefused):  # no lock file (a run from before the lock, or a copy), not ours, or no lock
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a file system without locks: nothing can be told
        return False
    finally:
        os.close(fd)  # closing drops the shared lock, if it was taken
    return False


def check_not_busy(path: Path) -> None:
    """RunDirBusy when a live process holds the run directory's lock; takes nothing itself."""
    if not os.path.lexists(path / LOCK_NAME):
        return
    os.close(lock_run_dir(path, write_pid=False))  # refuses a link or a FIFO in one line


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
