"""The run directory, by job (its layout is in directory.py):

  directory   RunArchive: creating, resuming and closing a run directory; rows, summary, checkpoints
  checkpoints the checkpoints folder: latest, best and the last K update-<N>, placed, pruned, named and read
  files       whole-or-nothing writes, the run directory's permissions, the write error's one line
  lock        one writer per run directory (flock)
  cleanup     what a resume removes: temporaries, dead processes' discovery files, rows after the checkpoint
  provenance  the code version and package versions recorded in meta.json
"""

from .checkpoints import CHECKPOINT_FORMAT, CHECKPOINT_KEYS, checkpoint_names, read_checkpoint, resolve_checkpoint
from .cleanup import remove_dead_targets, trim_metrics
from .directory import RunArchive, check_writable, default_run_dir, last_archive
from .files import GROUP_READABLE, OWNER_ONLY, ArchiveWriteError, atomic_write_bytes
from .lock import RunDirBusy, check_not_busy, lock_run_dir
from .provenance import code_version, package_versions

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_KEYS", "GROUP_READABLE", "OWNER_ONLY", "ArchiveWriteError", "RunArchive",
           "RunDirBusy", "atomic_write_bytes", "check_not_busy", "check_writable", "checkpoint_names", "code_version",
           "default_run_dir", "last_archive", "lock_run_dir", "package_versions", "read_checkpoint",
           "remove_dead_targets", "resolve_checkpoint", "trim_metrics"]
