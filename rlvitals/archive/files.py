"""Writing into a run directory: whole files or nothing, with the run directory's permissions.

Permissions: a run directory is owner-only (0700) unless the run asked for group
access (`group_readable`: 0750). Every folder inside takes the run directory's
mode, and every file its folder's read and write bits (0600, or 0640), so whoever
writes a file needs to know nothing but where it goes. The process umask can
only take bits away from a new file; set_tree_mode, at a resume and at the end,
sets the whole tree.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path
from typing import Protocol

from ..config import ConfigError


class ArchiveState(Protocol):
    """What a write error reports of the run directory it happened in (directory.RunArchive has these)."""

    path: Path
    last_checkpoint_updates: int | None
    summary_written: bool
    summary_failed: bool
    rows_lost: int
    not_written: list[str]

OWNER_ONLY = 0o700
GROUP_READABLE = 0o750
"""Modes of a run directory and its folders; files get the same bits less execute."""


def folder_mode(group_readable: bool) -> int:
    return GROUP_READABLE if group_readable else OWNER_ONLY


def file_mode(folder: Path) -> int:
    """The read and write bits of `folder`: 0600 in an owner-only folder, 0640 in a group-readable one."""
    return stat.S_IMODE(folder.stat().st_mode) & 0o666


def make_folder(path: Path, mode: int) -> None:
    """Create `path` (or take an existing one) with exactly `mode` (chmod: the umask of mkdir is not enough
    for a folder that already existed)."""
    path.mkdir(mode=mode, exist_ok=True)
    os.chmod(path, mode)


def set_tree_mode(root: Path, mode: int) -> None:
    """Give `root` and every folder under it `mode`, and every file `mode` less execute: for a resume that
    changes the setting, a run directory written by an older rlvitals, and files that libraries write with
    the umask (TensorBoard's event files). Links are left alone."""
    os.chmod(root, mode)
    for folder, subfolders, files in os.walk(root):
        for name, wanted in [(n, mode) for n in subfolders] + [(n, mode & 0o666) for n in files]:
            path = Path(folder) / name
            try:
                if not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) != wanted:
                    os.chmod(path, wanted)
            except FileNotFoundError:  # gone meanwhile (the discovery file of a process that ended)
                pass


def size_text(n: float) -> str:
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

    def __init__(self, path: Path, size: int | None, error: OSError, kept: str = "temporary file removed"):
        super().__init__(str(path))
        self.path, self.size, self.error, self.kept = Path(path), size, error, kept
        """size: bytes the write needed (None: not known); kept: what the failed write left, in words (an atomic
        write leaves nothing: its temporary goes)."""
        self.archive: ArchiveState | None = None
        try:
            self.free = shutil.disk_usage(self.path.parent).free
        except OSError:
            self.free = None

    @property
    def no_space(self) -> bool:
        return self.error.errno in NO_SPACE

    def __str__(self) -> str:
        what = "no space left" if self.no_space else (self.error.strerror or type(self.error).__name__).lower()
        room = [f"{size_text(n)} {said}" for n, said in ((self.size, "needed"), (self.free, "free there"))
                if n is not None]
        room_text = f" ({', '.join(room)})" if room else ""
        text = f"{what} writing {self.path}{room_text}: {self.kept}"
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
        for name in archive.not_written:
            text += f", {name} not written"
        return text + f"; free space, then continue with: rlvitals train --resume {archive.path}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: temp file, fsync, rename, fsync of the folder.

    The file gets its folder's read and write bits (file_mode). A link planted under the
    temporary's name is not followed (O_NOFOLLOW), and the rename replaces a link at `path`
    rather than writing through it. ArchiveWriteError when it cannot be written (the temp
    file is removed, `path` is untouched).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode(path.parent))
        with open(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_folder(path.parent)
    except BaseException as exc:  # a failed write, or a stop arriving mid-write: no temporary file stays
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise ArchiveWriteError(path, len(data), exc) from None
        raise


RESERVE_NAME = ".space-reserve"
RESERVE_BYTES = 32 * 1024
"""Room a run holds while it writes (this file), given up for summary.json and verdicts.json once a write has
failed: a disk filled by the run's own rows still takes the files that say how it ended."""


def hold_reserve(run_dir: Path) -> None:
    """Set RESERVE_BYTES aside in `run_dir` (best effort: a disk too full for it simply has none)."""
    path = run_dir / RESERVE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode(run_dir))
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
    except OSError:
        release_reserve(run_dir)


def release_reserve(run_dir: Path) -> None:
    try:
        (run_dir / RESERVE_NAME).unlink(missing_ok=True)
    except OSError:
        pass


class LinkRefused(ConfigError):
    """A run directory holds a symbolic link where rlvitals writes: writing would land outside it."""


def refuse_links(run_dir: Path) -> None:
    """LinkRefused (one line) naming the first symbolic link in the run directory, its checkpoints/ or
    discovery/: a writer appends to metrics.jsonl, truncates it on resume, replaces checkpoints and removes
    discovery files, and through a link any of these would reach another file of the user's."""
    for folder in (run_dir, run_dir / "checkpoints", run_dir / "discovery"):
        if folder != run_dir and folder.is_symlink():
            link = folder
        elif not folder.is_dir():
            continue
        else:
            link = next((Path(e.path) for e in os.scandir(folder) if e.is_symlink()), None)
        if link is not None:
            raise LinkRefused(f"run_dir={str(run_dir)!r} is invalid: {link.relative_to(run_dir)} is a symbolic "
                              f"link; expected a run directory without links (rlvitals never writes through one: "
                              "replace it with the file itself)")


def fsync_folder(folder: Path) -> None:
    """Make a rename or link in `folder` durable: fsync of the folder itself."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
