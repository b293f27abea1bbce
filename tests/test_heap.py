"""Freed heap memory goes back to the system (bot.service.heap, called by the gateway)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bot.service import heap
from tests.helpers import REPO

# Freed blocks below one still in use: glibc's free() alone keeps them all resident.
SCRIPT = """
import json
from bot.service import heap
blocks = [b"x" * 20_000 for _ in range(3_000)]  # 60 MB of heap, not mmap-sized blocks
pin = b"y" * 20_000  # above them all, so free() cannot shrink the heap from the top
del blocks
before = heap.rss_bytes()
freed = heap.release_free_memory()
print(json.dumps({"before": before, "after": heap.rss_bytes(), "freed": freed}))
"""


@pytest.mark.skipif(heap._malloc_trim() is None, reason="the C library has no malloc_trim")
def test_freed_heap_memory_goes_back_to_the_system() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    mib = 2**20
    assert figures["freed"] > 40 * mib, figures
    assert figures["after"] < figures["before"] - 40 * mib, figures


def test_rss_is_read_from_proc() -> None:
    rss = heap.rss_bytes()
    assert rss is not None and 5 * 2**20 < rss < 4 * 2**30
