"""Which workspace files are long-term memory, and a cheap way to notice they changed."""

from __future__ import annotations

from pathlib import Path

MEMORY_FILES = ("USER.md", "SOUL.md", "memory/MEMORY.md")
SKILLS_DIR = "skills"


def memory_stamp(workspace: Path) -> tuple[tuple[str, int, int], ...]:
    """(path, mtime_ns, size) of every memory file and SKILL.md: equal stamps, no change.

    A few stat calls, cheap enough to take before and after every turn.
    """
    out = []
    paths = [workspace / name for name in MEMORY_FILES]
    skills = workspace / SKILLS_DIR
    if skills.is_dir():
        paths += sorted(skills.glob("*/SKILL.md"))
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        out.append((str(path), st.st_mtime_ns, st.st_size))
    return tuple(out)
