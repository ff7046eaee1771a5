"""The memory a process holds for its data: what a leak grows and an allocator's free lists do not.

Resident memory (RSS) is the wrong figure to judge a leak on. A healthy
LunarLander run in one process gains about 150 bytes of RSS per sample, and
about 4 bytes of it are in use: the rest is glibc's free lists, fragmented by
Box2D's per-episode worlds among numpy's and torch's buffers, resident but
reusable. A process that reads Ray's shared object store also gains RSS for
every page of the store it touches.

`memory_in_use()` is the private anonymous memory (`RssAnon`: heap, mmapped
tensors and arrays, Python's arenas; not libraries, not shared memory such as
Ray's object store) less the bytes glibc's malloc holds free (`mallinfo2`).
Where either is unavailable (not Linux, not glibc) it falls back to RSS.
Cost: about 0.2 ms (mallinfo2 walks the allocator's bins); read once per
update or rollout, never per sample.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import psutil


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.mallinfo2            # glibc >= 2.33
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


_MALLINFO2 = _mallinfo2()


def _rss_anon() -> float | None:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return float(line.split()[1]) * 1024.0      # kB
    except OSError:
        pass
    return None


def malloc_free_bytes() -> float:
    """Bytes glibc's malloc holds free in its arenas (0 where it cannot be read)."""
    return float(_MALLINFO2().fordblks) if _MALLINFO2 is not None else 0.0


def memory_in_use() -> float:
    """This process's private resident memory less its allocator's free bytes (RSS where unreadable)."""
    anon = _rss_anon()
    if anon is None:
        return float(psutil.Process().memory_info().rss)
    return max(0.0, anon - malloc_free_bytes())
