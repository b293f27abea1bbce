"""A memory per person: ``memory/people/<channel>-<id>.md``.

Where several people talk to memobot (people let in by ``allowFrom`` or pairing, groups), what
it learns about one of them is kept in that person's own file, never in USER.md (the owner's).
The file opens with a header memobot writes, the name the platform gave and the id::

    # Ada Lovelace (telegram 1001)

It is in the system prompt of that person's own turns only (bot.context), the file tools of
those turns may read and write it and no other person's (bot.privacy), and Dream routes the
facts a person stated about themselves there (bot.memory.dream), by the speaker the history
entry records (bot.memory.history).

Why under ``memory/``: everything there is the owner's private memory to a turn that is not the
owner's, so a reader that does not know of person files (a listing, a future tool) hides them;
a turn sees its own file only by the one exception bot.privacy makes for it.

Pure functions over names and text, plus :func:`ensure_file` and :func:`listing` (blocking I/O
through bot.workspace_files: call them in a worker thread).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from bot import workspace_files

PEOPLE_DIR = "memory/people"
# Names and ids go into a file name as they are where they are safe, %XX elsewhere. "-" is
# escaped too, so the first "-" of a name always ends the channel.
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
PERSON_PATH = re.compile(r"^memory/people/([A-Za-z0-9_%]{1,64})-([A-Za-z0-9_%]{1,200})\.md$")
_HEADER = re.compile(r"^# (?P<name>.*) \((?P<channel>\S+) (?P<id>\S+)\)\s*$")
MAX_NAME_CHARS = 100
_BRACKETS = str.maketrans("()", "[]")
# What a prompt or Dream's brief shows of a person's file, at most: the person may write their
# file with the file tools (megabytes of it made every Dream request too large, and Dream
# never got past their chat's entries); what is past it is said to be left out.
SHOWN_CHARS = 16_000
NO_NAME = "(no name)"  # shown for a person whose platform gave no name
# The runtime block's line naming who wrote a message (bot.context.runtime_block).
FROM_PREFIX = "from: "
_FROM = re.compile(r"^from: (?P<name>.*) \((?P<channel>\S+) (?P<id>\S+)\)$")


@dataclass(frozen=True, slots=True)
class Speaker:
    """Someone who wrote in a chat: the platform's channel name and user id, and the name it
    gave (display names change; the id is what a file is named by)."""

    channel: str
    id: str
    name: str = ""

    @property
    def file(self) -> str:
        return person_file(self.channel, self.id)

    @property
    def shown(self) -> str:
        """``Ada Lovelace (telegram 1001)``: how the prompt, the header and Dream name them."""
        return f"{self.name or NO_NAME} ({self.channel} {self.id})"


def _escape(text: str) -> str:
    return "".join(
        ch if ch in _SAFE else "".join(f"%{b:02X}" for b in ch.encode("utf-8")) for ch in text
    )


def person_file(channel: str, sender_id: str) -> str:
    """The workspace-relative memory file of one person."""
    return f"{PEOPLE_DIR}/{_escape(channel)}-{_escape(sender_id)}.md"


def clean_name(name: object) -> str:
    """A platform's display name as one line of plain text (it is the person's own text and
    goes into a prompt and a header): control characters and line breaks become spaces, and
    round brackets square ones (a name "Carol (telegram 4004)" would read as her id where
    memobot names the writer: ``Carol [telegram 4004] (telegram 3003)``)."""
    text = "".join(" " if not ch.isprintable() else ch for ch in str(name or ""))
    return " ".join(text.translate(_BRACKETS).split())[:MAX_NAME_CHARS]


def header(speaker: Speaker) -> str:
    return f"# {speaker.shown}\n\n"


def read_header(text: str) -> Speaker | None:
    """The person a file's first line names, or None when it has no memobot header."""
    first = text.split("\n", 1)[0]
    m = _HEADER.match(first)
    if m is None:
        return None
    return Speaker(m["channel"], m["id"], _name(m["name"]))


def _name(shown: str) -> str:
    return "" if shown == NO_NAME else shown


def _unescape(text: str) -> str:
    raw = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%" and i + 3 <= len(text):
            raw.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(text[i].encode("utf-8"))
            i += 1
    return raw.decode("utf-8", errors="replace")


def person_of(rel: str, text: str) -> Speaker | None:
    """Whose file ``rel`` is: the channel and id its name gives, with the name its header
    gives when that header names the same channel and id (the person writes their own file:
    a header claiming someone else is not believed). None: not a person's file name."""
    m = PERSON_PATH.match(rel)
    if m is None:
        return None
    try:
        channel, ident = _unescape(m[1]), _unescape(m[2])
    except ValueError:
        return None
    said = read_header(text)
    name = said.name if said and (said.channel, said.id) == (channel, ident) else ""
    return Speaker(channel, ident, name)


def with_header(text: str, speaker: Speaker) -> str:
    """``text`` with the header naming ``speaker`` first (added when it has none)."""
    if read_header(text) is not None:
        return text
    return header(speaker) + text.lstrip("\n")


def shown_part(text: str, size: int | None = None) -> str:
    """``text`` cut at :data:`SHOWN_CHARS`, with a note saying how much is not shown
    (``size``: the file's whole size in bytes, when ``text`` is only its start)."""
    if len(text) <= SHOWN_CHARS and (size is None or size <= len(text.encode("utf-8"))):
        return text
    rest = len(text) - SHOWN_CHARS if size is None else size - len(text[:SHOWN_CHARS].encode())
    return (
        text[:SHOWN_CHARS].rstrip()
        + f"\n[... {rest:,} more characters of this file not shown: it is too long]"
    )


def read_shown(workspace: Path, rel: str) -> str:
    """The start of a person's file as :func:`shown_part` shows it ("" when absent, a link,
    not a file); never more of it read than that."""
    try:
        data = workspace_files.read_bytes(workspace, rel, limit=SHOWN_CHARS * 4 + 4)
        st = workspace_files.file_stat(workspace, rel)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return ""
    return shown_part(data.decode("utf-8", errors="replace"), None if st is None else st.st_size)


def from_line(speaker: Speaker) -> str:
    """The runtime block's line naming who wrote the message (bot.context)."""
    return FROM_PREFIX + speaker.shown


def speaker_in_block(block: str) -> Speaker | None:
    """The speaker the runtime block ``block`` names (its first ``from:`` line: memobot's own,
    which comes before anything a person's attachments may add), or None."""
    for line in block.split("\n"):
        if line.startswith("[attached files"):
            return None
        m = _FROM.match(line)
        if m is not None:
            return Speaker(m["channel"], m["id"], _name(m["name"]))
    return None


@dataclass(frozen=True, slots=True)
class PersonFile:
    rel: str
    speaker: Speaker  # from its name; the name from its header (bot.memory.people.person_of)
    size: int


def listing(workspace: Path) -> list[PersonFile]:
    """Every person's file there is (regular files only, no link followed), by path."""
    out = []
    for name, st in workspace_files.list_dir(workspace, PEOPLE_DIR):
        rel = f"{PEOPLE_DIR}/{name}"
        if not stat.S_ISREG(st.st_mode) or not PERSON_PATH.match(rel):
            continue
        who = person_of(rel, _head(workspace, rel))
        if who is not None:
            out.append(PersonFile(rel, who, st.st_size))
    return out


def _head(workspace: Path, rel: str) -> str:
    """The start of a file, enough for its header (the person may have made it large)."""
    try:
        return workspace_files.read_bytes(workspace, rel, limit=2048).decode("utf-8", "replace")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return ""


def find(workspace: Path, who: str) -> str | None:
    """The file of ``who``: a path, ``telegram-1001``, ``telegram:1001`` or a name its header
    gives (case-insensitive, when only one file has it)."""
    who = who.strip()
    if PERSON_PATH.match(who):
        return who
    channel, sep, ident = who.partition(":")
    if sep and channel and ident:
        return person_file(channel, ident)
    files = listing(workspace)
    for f in files:
        if f.rel == f"{PEOPLE_DIR}/{who}.md" or f.rel == f"{PEOPLE_DIR}/{who}":
            return f.rel
    named = [f.rel for f in files if f.speaker.name and f.speaker.name.casefold() == who.casefold()]
    return named[0] if len(named) == 1 else None


def ensure_file(workspace: Path, speaker: Speaker) -> bool:
    """Create the person's file with its header when there is none; True when it was made.
    Never through a link; an existing file (whatever it holds) is left as it is."""
    rel = speaker.file
    if workspace_files.lexists(workspace, rel):
        return False
    workspace_files.make_dirs(workspace, PEOPLE_DIR)
    try:
        # O_EXCL: a file written meanwhile (the model, Dream) is never replaced.
        fd = workspace_files.open_fd(workspace, rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(header(speaker))
    return True
