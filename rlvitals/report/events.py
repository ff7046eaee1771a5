"""One TensorBoard event file, written in the caller's thread.

tensorboardX's own writer hands events to a background thread: a full disk there
printed a traceback per flush, and its close then waited for ever. Here a failed
write raises where the row is handed over, so the caller can say so in one line.

The file is created new (O_EXCL) and never through a link (O_NOFOLLOW): a run
directory may come from anyone, and a name planted there must not make a write
land elsewhere. Its mode is the caller's (the run directory's, files.file_mode).
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

EVENT_PREFIX = "events.out.tfevents."
"""TensorBoard reads every file whose name holds `tfevents`; this is the name its own writers give."""


class EventFile:
    def __init__(self, folder: Path, mode: int):
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.record_writer import masked_crc32c

        self._event, self._crc = Event, masked_crc32c
        stem = f"{EVENT_PREFIX}{int(time.time())}.{socket.gethostname()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for n in range(100):  # a second file in the same second (a resume, a quick re-export): a suffix
            self.path = folder / (stem if n == 0 else f"{stem}.{n}")
            try:
                fd = os.open(self.path, flags, mode)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"{folder / stem}: 100 event files of this second exist")
        self._file = open(fd, "wb")
        self.bytes_written = 0
        self.write(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_summary(self, summary, step: int, walltime: float | None) -> None:
        self.write(self._event(summary=summary, step=step, wall_time=time.time() if walltime is None else walltime))

    def write(self, event) -> None:
        """One record: length, its checksum, the event, its checksum (TFRecord framing)."""
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        record = header + struct.pack("<I", self._crc(header)) + data + struct.pack("<I", self._crc(data))
        self._file.write(record)
        self.bytes_written += len(record)

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Flush and close; the file is closed even when the flush fails (the error is raised after)."""
        try:
            self.flush()
        finally:
            try:
                self._file.close()
            except OSError:  # the same failed flush, raised again by close: already being raised
                pass
