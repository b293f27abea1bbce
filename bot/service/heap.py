"""Hand freed heap memory back to the system.

glibc keeps memory that Python frees inside its heaps for reuse, and gives back only what lies
at the top of a heap. In a daemon whose busy minutes (many chats at once, long tails, a burst
of consolidations) allocate far more than its quiet ones, that kept memory stays in the
resident set for good. ``malloc_trim`` returns every whole free page to the system; it walks
the heaps, so the gateway calls it now and then from a worker thread, not on the event loop.
Other C libraries (musl) have no such call and need none of this: there it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

# How often the gateway hands freed memory back. A trim of a 100 MiB heap costs a few ms in a
# worker thread (ctypes lets go of the GIL); between trims a busy gateway's RSS climbs about
# 1.5 MiB a minute that the next trim returns.
TRIM_EVERY_SECONDS = 10.0


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def rss_bytes(pid: int | str = "self") -> int | None:
    """The resident set of this process (or of ``pid``) on Linux; None where /proc is not
    there or the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def release_free_memory() -> int | None:
    """Give free heap pages back to the system (blocking: call it in a thread).

    Returns the bytes the resident set shrank by, or None where the C library cannot do it.
    """
    trim = _malloc_trim()
    if trim is None:
        return None
    before = rss_bytes()
    started = time.monotonic()
    trim(0)
    after = rss_bytes()
    freed = max(0, before - after) if before is not None and after is not None else 0
    log.debug(
        "heap trim: %.1f MiB back to the system in %.1f ms",
        freed / 2**20,
        (time.monotonic() - started) * 1000,
    )
    return freed
