"""A person's edit of a long-term memory file (the control panel's Memory screen).

Which files: USER.md, SOUL.md, memory/MEMORY.md, each existing ``skills/<name>/SKILL.md`` and
each existing person's file ``memory/people/<channel>-<id>.md`` (bot.memory.people); a name is
checked against those before anything is opened, so a form field cannot name another path. The
file is read as the hostile data it is (the model writes the workspace): never through a symlink
(at the file or a folder on the way), never a FIFO or device, never more than :data:`EDIT_LIMIT`
bytes, through :mod:`bot.workspace_files`.

A save is optimistic: it carries the digest of the version the person saw (the one the
preview's diff was made against). Under the memory repository's write lock the file is read
again; if it changed meanwhile (the model, Dream, another browser) nothing is written and
:class:`Stale` says so. Otherwise the file is replaced atomically (its mode kept) and that file
alone is committed, as made "by web".
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from bot import workspace_files
from bot.memory.files import MEMORY_FILES
from bot.memory.people import PERSON_PATH, listing
from bot.memory.versioning import DEFAULT_AUTHOR, WEB_AUTHOR, MemoryRepo, MemoryRepoError

# Memory files are in every prompt (memory.maxChars is their budget, 4,000 by default) and a
# skill is a page of steps: 64 KiB is far above either, and bounds what a page carries.
EDIT_LIMIT = 64 * 1024
ABSENT = "absent"  # the digest of a file that does not exist (yet)
SKILL_PATH = re.compile(r"^skills/([A-Za-z0-9][A-Za-z0-9._-]{0,99})/SKILL\.md$")


class EditError(Exception):
    """The file cannot be read or saved here. ``str()`` is a message for a person."""


class Stale(EditError):
    """The file changed after the person saw it: nothing was written."""


class _Unchanged(Exception):
    """The text is the file's already: nothing to write or commit."""


@dataclass(frozen=True, slots=True)
class Current:
    """A memory file as it is on disk now."""

    rel: str
    text: str
    digest: str  # sha256 of its bytes, or ABSENT
    mode: int  # permission bits; 0o600 for a file still to be created

    @property
    def exists(self) -> bool:
        return self.digest != ABSENT


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def editable_files(workspace: Path) -> list[str]:
    """The memory files (present or not), every skill's SKILL.md and every person's file,
    in that order."""
    skills = workspace_files.files_matching(workspace, "skills", "SKILL.md")
    people = [f.rel for f in listing(workspace)]
    return [*MEMORY_FILES, *(rel for rel, _ in skills if SKILL_PATH.match(rel)), *people]


def check_name(rel: str) -> str:
    """``rel`` when it names a file a person may edit here, else EditError (before any I/O)."""
    if rel in MEMORY_FILES or SKILL_PATH.match(rel) or PERSON_PATH.match(rel):
        return rel
    raise EditError(
        f"{rel!r} is not a memory file: the panel edits USER.md, SOUL.md, memory/MEMORY.md, "
        "skills/<name>/SKILL.md and memory/people/<person>.md"
    )


def read_current(workspace: Path, rel: str) -> Current:
    """The file ``rel`` as it is now. Raises EditError when it is not a memory file, is a
    link or leads through one, is a folder or a special file, is larger than EDIT_LIMIT or
    is not UTF-8 text, and for a skill that does not exist."""
    check_name(rel)
    why = _unreadable(workspace, rel)
    if why == ABSENT:
        if rel not in MEMORY_FILES:
            raise EditError(f"{rel} does not exist: the panel edits the files there are")
        return Current(rel, "", ABSENT, 0o600)
    if why:
        raise EditError(f"{rel} {why}")
    try:
        fd = workspace_files.open_fd(workspace, rel, os.O_RDONLY)
    except workspace_files.LinkRefused:
        raise EditError(f"{rel} {_LINK}") from None
    except (FileNotFoundError, NotADirectoryError):
        return _absent_or_refused(rel)
    with os.fdopen(fd, "rb") as fh:
        mode = stat.S_IMODE(os.fstat(fh.fileno()).st_mode)
        data = fh.read(EDIT_LIMIT + 1)
    if len(data) > EDIT_LIMIT:
        raise EditError(f"{rel} {_too_big(len(data))}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EditError(f"{rel} is not UTF-8 text: edit it in a terminal") from None
    return Current(rel, text, digest(data), mode)


_LINK = (
    "is a symbolic link, or a folder on its way is: memobot never reads or writes through a "
    "link in the workspace (the model may have planted it). Look at it in a terminal and "
    "replace it with a plain file to edit it here."
)


def _too_big(size: int) -> str:
    return (
        f"is larger than the panel edits ({size:,} bytes or more, at most {EDIT_LIMIT:,}): "
        "edit it in a terminal"
    )


def _unreadable(workspace: Path, rel: str) -> str:
    """Why ``rel`` cannot be edited, from its own status (a link is not followed); ABSENT when
    it does not exist; "" when it is a regular file of a size the panel edits."""
    try:
        st = workspace_files.lstat(workspace, rel)
    except workspace_files.LinkRefused:
        return _LINK
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    if stat.S_ISLNK(st.st_mode):
        return _LINK
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a FIFO, socket or device): memobot never opens it"
    if st.st_size > EDIT_LIMIT:
        return _too_big(st.st_size)
    return ""


def _absent_or_refused(rel: str) -> Current:
    if rel in MEMORY_FILES:
        return Current(rel, "", ABSENT, 0o600)
    raise EditError(f"{rel} does not exist: the panel edits the files there are")


def from_form(text: str, original: str) -> str:
    """The text a browser sent for a file that was ``original``: browsers send every line
    break of a textarea as CRLF, so line ends are made LF again (CRLF when the file had
    only CRLF line ends)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\r\n" in original and original.count("\r\n") == original.count("\n"):
        text = text.replace("\n", "\r\n")
    return text


def text_problem(rel: str, text: str) -> str:
    """Why ``text`` cannot be saved as ``rel`` ("" when it can)."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return "the text holds characters that are not valid Unicode"
    if size > EDIT_LIMIT:
        return (
            f"the new text of {rel} is {size:,} bytes, more than the panel saves ({EDIT_LIMIT:,})"
        )
    return ""


def diff_lines(rel: str, old: str, new: str) -> list[str]:
    """A unified diff of ``old`` to ``new`` (git's a/ b/ names), one line per item, without
    line ends; [] when they are the same."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{rel}",
        tofile=f"b/{rel}",
    )
    return [line.rstrip("\r\n") for line in lines]


@dataclass(frozen=True, slots=True)
class Saved:
    written: bool  # False: the text was the file's already
    commit: str | None  # None: nothing new for the history (the file is as HEAD has it)


def save(
    workspace: Path, state_dir: Path, rel: str, text: str, seen: str, by: str = "web"
) -> Saved:
    """Write ``text`` to ``rel`` when the file is still the version whose digest is ``seen``,
    and commit that file alone as made ``by`` web (or ``by`` "cli": `memobot memory people
    edit`, whose commit is memobot's own) (when the text is the file's already, nothing
    is written or committed). Raises Stale (nothing written) when it
    changed, EditError when it cannot be read or written as :func:`read_current` says, or
    the text is too large."""
    check_name(rel)
    if problem := text_problem(rel, text):
        raise EditError(f"{problem}: nothing was saved")
    data = text.encode("utf-8")
    repo = MemoryRepo(workspace, state_dir)
    try:
        repo.check()  # a history that cannot be written: say so before the file changes
    except MemoryRepoError as exc:
        raise EditError(f"the memory history cannot be written: {exc}") from None

    written = False

    def write_if_unchanged() -> None:
        nonlocal written
        # Under the history's write lock: no memobot commit or revert interleaves; what the
        # model writes meanwhile is what the digest catches.
        current = read_current(workspace, rel)
        if current.digest != seen:
            raise Stale(
                f"{rel} changed after you opened it (the model, Dream or another edit wrote "
                "it): nothing was saved."
            )
        if current.text == text:
            # Nothing to write, and nothing to commit: an edit of the model's not committed
            # yet must not go into the history as made by web.
            raise _Unchanged
        workspace_files.write_atomic(workspace, rel, data, mode=current.mode, make_parents=True)
        written = True

    message = f"{by}: {rel} edited by {by}\n"
    author = WEB_AUTHOR if by == "web" else DEFAULT_AUTHOR
    try:
        commit = repo.commit(message, author, paths=(rel,), prepare=write_if_unchanged)
    except _Unchanged:
        return Saved(False, None)
    except MemoryRepoError as exc:
        if written:
            raise EditError(f"{rel} was saved, but not committed to the history: {exc}") from None
        raise EditError(f"nothing was saved: {exc}") from None
    return Saved(True, commit)
