"""Which workspace files are long-term memory, and a cheap way to notice they changed."""

from __future__ import annotations

from pathlib import Path

from bot import workspace_files
from bot.memory.people import PEOPLE_DIR

MEMORY_FILES = ("USER.md", "SOUL.md", "memory/MEMORY.md")
SKILLS_DIR = "skills"


def memory_stamp(workspace: Path) -> tuple[tuple[str, int, int], ...]:
    """(path, mtime_ns, size) of every memory file, person's file (memory/people/) and
    SKILL.md: equal stamps, no change.

    A few stat calls, cheap enough to take before and after every turn. Links are not
    followed: a link counts as absent.
    """
    out = []
    for rel in MEMORY_FILES:
        st = workspace_files.file_stat(workspace, rel)
        if st is not None:
            out.append((str(workspace / rel), st.st_mtime_ns, st.st_size))
    for name, st in workspace_files.list_dir(workspace, PEOPLE_DIR):
        out.append((str(workspace / PEOPLE_DIR / name), st.st_mtime_ns, st.st_size))
    for rel, st in workspace_files.files_matching(workspace, SKILLS_DIR, "SKILL.md"):
        out.append((str(workspace / rel), st.st_mtime_ns, st.st_size))
    return tuple(out)
