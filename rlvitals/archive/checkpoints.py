"""The checkpoints folder of a run: which files it holds, how they are placed, pruned, named and read.

  latest.pt      written at every checkpoint; what a resume reads
  best.pt        the checkpoint at whose write the mean return of the last 100 episodes was the highest
                 so far (judged at every checkpoint write; a later one must beat it, a tie keeps the earlier)
  update-<N>.pt  the checkpoint of update N; the newest `keep_checkpoints` are kept, older ones removed

best.pt and update-<N>.pt are hard links to the latest.pt just written: no second write, and no extra
space while they are the same checkpoint. Where the filesystem has no hard links they are copies. Either
way a file appears whole or not at all (a temporary name, then a rename), and an older file is removed
only after its successor is in place, so the last good checkpoint is never deleted.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Any

from .files import atomic_write_bytes, fsync_folder

CHECKPOINT_FORMAT = "rlvitals-checkpoint-v1"
CHECKPOINT_KEYS = ("config", "network", "optimizer", "age", "tracker", "learner", "rng")
"""What every checkpoint holds (later versions add keys; none of these go)."""

LATEST, BEST = "latest", "best"
UPDATE_FILE = re.compile(r"^update-(\d+)\.pt$")
NAME = re.compile(r"^(latest|best|update-\d+)(\.pt)?$")
"""A checkpoint named by its place in a run's checkpoints/ folder rather than by a path."""


def update_file(updates: int) -> str:
    return f"update-{updates}.pt"


def place_as(latest: Path, target: Path, data: bytes | None = None) -> None:
    """Make `target` the same checkpoint as `latest`, whole or not at all.

    A hard link under a temporary name renamed over `target`; where no hard link can be
    made (a filesystem without them), a copy written by atomic_write_bytes (`data`, or the
    bytes of `latest`), which raises ArchiveWriteError when it does not fit.
    """
    if target.exists() and target.samefile(latest):
        return  # already linked (a resume placing again); renaming a link over its twin would leave the temporary
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # the name resume's cleanup removes
    try:
        tmp.unlink(missing_ok=True)
        os.link(latest, tmp)
        os.replace(tmp, target)
        fsync_folder(target.parent)
    except OSError:
        tmp.unlink(missing_ok=True)
        atomic_write_bytes(target, latest.read_bytes() if data is None else data)


def prune_updates(folder: Path, keep: int) -> list[str]:
    """Remove all but the newest `keep` update-<N>.pt files of `folder`; the names removed.

    latest.pt and best.pt are never touched, so a run keeps a loadable checkpoint whatever `keep` is.
    """
    found = sorted((int(m.group(1)), path) for path in folder.iterdir() if (m := UPDATE_FILE.match(path.name)))
    removed = []
    for _, path in found[: max(0, len(found) - keep)]:
        try:
            path.unlink(missing_ok=True)
        except OSError:  # an old file that cannot go costs space, not the run: the next checkpoint tries again
            continue
        removed.append(path.name)
    return removed


def checkpoint_names(folder: Path) -> list[str]:
    """The checkpoints in `folder` by name, as `--checkpoint` takes them: latest, best, then update-<N> by N."""
    if not folder.is_dir():
        return []
    updates = sorted(int(m.group(1)) for p in folder.iterdir() if (m := UPDATE_FILE.match(p.name)))
    return [n for n in (LATEST, BEST) if (folder / f"{n}.pt").is_file()] + [f"update-{n}" for n in updates]


def resolve_checkpoint(run_dir: str | Path | None, checkpoint: str = LATEST) -> Path:
    """The file `checkpoint` means: a name (latest, best, update-<N>) inside run_dir's checkpoints/, or a path.

    With a run directory a name is always the run's; without one, a name that is a file here is that file.
    ValueError (one line) naming what exists when it cannot be found.
    """
    try:
        return _resolve(run_dir, checkpoint)
    except PermissionError as exc:  # a folder on the way this user may not read or search (mode 000)
        raise ValueError(_not_readable(run_dir, checkpoint, exc)) from None


def _not_readable(run_dir: str | Path | None, checkpoint: str, exc: PermissionError) -> str:
    """One line naming the first folder on the way to the checkpoint that this user cannot enter, and its mode."""
    path = Path(exc.filename or checkpoint)
    folders = [Path(run_dir), Path(run_dir) / "checkpoints"] if run_dir is not None else list(path.parents)[::-1]
    blocked = next((f for f in folders if f.is_dir() and not os.access(f, os.R_OK | os.X_OK)), path)
    try:
        mode = f", mode {os.stat(blocked).st_mode & 0o777:03o}"
    except OSError:
        mode = ""
    return (f"checkpoint={checkpoint!r} cannot be read: {str(blocked)!r} is not readable by this user "
            f"({exc.strerror}{mode}); expected a run directory and checkpoints folder this user may read")


def _resolve(run_dir: str | Path | None, checkpoint: str) -> Path:
    expected = "expected a path to a checkpoint file, or latest, best or update-<N> with a run directory"
    if NAME.match(checkpoint) and (run_dir is not None or not Path(checkpoint).exists()):
        if run_dir is not None and not (Path(run_dir) / "config.yaml").is_file():
            raise ValueError(f"run_dir={str(run_dir)!r} is invalid: no config.yaml there; expected a run directory")
        if run_dir is None:
            raise ValueError(f"checkpoint={checkpoint!r} names a checkpoint of a run, but no run directory "
                             f"(--run-dir) was given; {expected}")
        folder = Path(run_dir) / "checkpoints"
        path = folder / (checkpoint if checkpoint.endswith(".pt") else f"{checkpoint}.pt")
        if not path.is_file():
            there = ", ".join(checkpoint_names(folder)) or "none"
            raise ValueError(f"checkpoint={checkpoint!r} is not in {str(folder)!r} (there: {there}); {expected}")
        return path
    path = Path(checkpoint)
    if not path.exists():
        raise ValueError(f"checkpoint={checkpoint!r} does not exist; {expected}")
    if path.is_dir():
        raise ValueError(f"checkpoint={checkpoint!r} is a directory, not a checkpoint file; {expected}")
    return path


def _load(fd: int, path: Path):
    import torch

    try:
        with open(fd, "rb", closefd=False) as fh, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's remarks on foreign pickles: the one line below says it all
            return torch.load(fh, map_location="cpu", weights_only=True)
    except Exception:  # torn, foreign, or holding objects other than tensors and plain data (never unpickled)
        raise ValueError(f"checkpoint {str(path)!r} is not an rlvitals checkpoint: it is truncated, corrupt, "
                         "or holds objects other than tensors and plain data, which are never loaded") from None


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint file as a dict, loaded with weights_only=True; ValueError (one line) when it is not one,
    or is no regular file (a FIFO would block the load for ever), or is larger than this machine's memory."""
    from ..limits import UnreadableFile, machine_memory, open_regular, size_text

    try:
        fd = open_regular(path, "checkpoint")  # a FIFO would block torch.load for ever, a device never end
    except IsADirectoryError:
        raise ValueError(f"checkpoint {str(path)!r} is a directory, not an rlvitals checkpoint") from None
    except FileNotFoundError:
        raise ValueError(f"checkpoint {str(path)!r} does not exist") from None
    except OSError as exc:
        raise ValueError(f"checkpoint {str(path)!r} is unreadable: {exc.strerror or exc}") from None
    except UnreadableFile as exc:
        raise ValueError(str(exc).replace("expected a regular file", "expected a checkpoint file")) from None
    try:
        size, limit = os.fstat(fd).st_size, machine_memory()
        if size > limit:  # loading it would take more memory than this machine has
            raise ValueError(f"checkpoint {str(path)!r} is invalid: it holds {size_text(size)}, more than this "
                             f"machine's {size_text(limit)} of memory; expected an rlvitals checkpoint")
        state = _load(fd, path)
    finally:
        os.close(fd)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {str(path)!r} is not an rlvitals checkpoint")
    missing = [key for key in CHECKPOINT_KEYS if key not in state]
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} is incomplete: it lacks {', '.join(missing)}")
    return state
