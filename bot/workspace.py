"""The workspace folder: where the template lives and how a new workspace is set up.

Installed wheels carry the template as ``bot/workspace_template`` (pyproject force-include);
a source checkout or editable install has it at the repository root, next to ``bot/``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from bot import workspace_files

# Read into the system prompt every turn, in this order (paths relative to the workspace).
WORKSPACE_PROMPT_FILES: tuple[str, ...] = (
    "AGENTS.md",
    "SOUL.md",
    "USER.md",
    "TOOLS.md",
    "memory/MEMORY.md",
)
# Folders every workspace has, even if the template one day ships nothing inside them.
WORKSPACE_DIRS: tuple[str, ...] = ("memory", "skills")
HISTORY_FILE = "memory/history.jsonl"
TEMPLATE_NAME = "workspace_template"
MEDIA_DIR = "media"
_UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.-]")

# The workspace holds what the agent remembers about people: private to the daemon's user.
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_SKIP_NAMES = frozenset({"__pycache__", ".DS_Store"})


def workspace_shape_problem(workspace: Path) -> str | None:
    """One line naming the first workspace path of the wrong kind (a folder where memobot
    reads a file, or the reverse), or None when the layout is usable."""
    if workspace.exists() and not workspace.is_dir():
        return f"workspace {workspace} must be a folder, but it is a file; move it away"
    for name in WORKSPACE_DIRS:
        path = workspace / name
        if path.exists() and not path.is_dir():
            return f"workspace folder {path} is a file; move it away"
    for name in (*WORKSPACE_PROMPT_FILES, HISTORY_FILE):
        path = workspace / name
        if path.exists() and not path.is_file():
            return f"memory file {path} is not a regular file (a folder?); move it away"
    return None


def chat_media_dir(channel: str, chat_id: str) -> PurePosixPath:
    """Where a chat's downloaded files go, relative to the workspace: ``media/<channel>/<chat>``.

    One folder per chat (a forum topic and a Slack thread are chats of their own), so a chat's
    privacy scope can tell its own files from every other chat's. Characters outside
    ``A-Za-z0-9_.-`` become ``_``; platform chat ids never contain ``_``, so two chats never
    share a folder, and a name of dots only cannot climb out.
    """
    name = _UNSAFE_IN_NAME.sub("_", chat_id)
    if not name.strip("."):
        name = name.replace(".", "_") or "_"
    return PurePosixPath(MEDIA_DIR, _UNSAFE_IN_NAME.sub("_", channel) or "_", name)


def template_dir() -> Path:
    """The folder ``onboard`` copies from. Raises FileNotFoundError if neither place has it."""
    package_dir = Path(__file__).resolve().parent
    candidates = (package_dir / TEMPLATE_NAME, package_dir.parent / TEMPLATE_NAME)
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"workspace template not found (looked in {looked})")


def _template_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in _SKIP_NAMES or part.endswith(".pyc") for part in rel.parts):
            continue
        if path.is_file():
            files.append(rel)
    return files


def _mkdir(workspace: Path, rel: Path, created: list[Path]) -> None:
    if workspace_files.is_dir(workspace, rel):
        return  # there already, or just made by another memobot starting at the same time
    try:
        workspace_files.make_dirs(workspace, rel)  # 0700 whatever the umask
    except workspace_files.LinkRefused:
        return  # a link the model left: its template files are skipped too (logged once)
    created.append(workspace / rel)


def init_workspace(workspace: Path, template: Path | None = None) -> list[Path]:
    """Create ``workspace`` and copy in every template file it does not have yet.

    A file that already exists is never touched, so running ``onboard`` again only fills gaps
    and keeps everything the user or the agent wrote. New folders get mode 0700 and new files
    0600; nothing is created through a link the model left in the workspace. Returns the
    folders and files created, in creation order. Raises OSError when the workspace cannot be
    written and FileNotFoundError when the template is missing.
    """
    template = template or template_dir()
    created: list[Path] = []
    if not workspace.is_dir():
        workspace.parent.mkdir(parents=True, exist_ok=True)
        try:
            workspace.mkdir(mode=_DIR_MODE)
        except FileExistsError:
            if not workspace.is_dir():
                raise
        else:
            os.chmod(workspace, _DIR_MODE)  # mkdir's mode passed through the umask
            created.append(workspace)
    for name in WORKSPACE_DIRS:
        _mkdir(workspace, Path(name), created)
    for rel in _template_files(template):
        for parent in reversed(rel.parents[:-1]):
            _mkdir(workspace, parent, created)
        data = (template / rel).read_bytes()
        try:
            # O_EXCL: never overwrite, not even a file created a moment ago by someone else,
            # and never follow a symlink left at the destination.
            fd = workspace_files.open_fd(
                workspace, rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE
            )
        except (FileExistsError, workspace_files.LinkRefused):
            continue
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        created.append(workspace / rel)
    return created
