"""Who a turn speaks for, and how much of the owner's data it may see (DESIGN.md section 12).

One :class:`PrivacyScope` per turn, decided once when the turn starts and handed to everything
that can show the owner's data: the prompt builder (which prompt files), ``memory_search``
(which history) and the file tools (which workspace paths). Three audiences:

* ``owner``: an admin in a private chat, or the terminal. Sees everything.
* ``guest``: someone let in by ``allowFrom`` or pairing who is not an admin, in a private chat.
* ``group``: anyone in a group chat, admins included (the others there read the answer).

A guest or a group sees the owner's memory (USER.md, memory/MEMORY.md, the history of the
owner's own chats through ``memory_search``, never the archive files, which hold every chat's)
only where ``memory.shareWithNonAdmins`` / ``memory.shareInGroups`` say so, and never writes
it; it never sees the owner's heartbeat list, other chats' downloaded files or the shared
temporary folder, and never rewrites the prompt files every chat reads. Of the
people's memory files (bot.memory.people) it sees and writes the speaker's own at most (a
group's turns only with ``memory.peopleInGroups``), never another's. Pure: no I/O
here; :func:`bot.tools.paths.resolve_tool_path` applies :meth:`PrivacyScope.hidden` to real
(symlink-free) paths.

A turn's scope comes from :func:`scope_for_person` (a message) or
:func:`scope_for_unattended` (a scheduled job, the heartbeat); both only pick one of
:func:`owner_scope`, :func:`guest_scope` and :func:`group_scope`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Literal

from bot.kinds import NARROWED_KEY as NARROWED_KEY  # its home before bot.kinds
from bot.memory.people import person_file
from bot.session import SUFFIX, key_to_filename
from bot.workspace import MEDIA_DIR, chat_media_dir

if TYPE_CHECKING:
    from bot.bus import InboundMessage
    from bot.config import MemoryConfig

Audience = Literal["owner", "guest", "group"]
# What the owner's memory is made of (names casefolded; compared per path component).
PROMPT_MEMORY_FILES = frozenset({"USER.md", "memory/MEMORY.md"})
_MEMORY_ROOT_FILES = frozenset({"user.md"})  # and their temporary siblings (.USER.md.*)
# History, cursors, archives; old versions; the owner's journal (the daily-notes skill).
_MEMORY_FOLDERS = frozenset({"memory", ".git", "notes"})
# The owner's own, whatever is shared: the heartbeat's task list (its answers go to the owner).
_OWNER_ROOT_FILES = frozenset({"heartbeat.md"})
# Read into every chat's system prompt, the owner's too: readable, never written from here.
_PROMPT_ROOT_FILES = frozenset({"agents.md", "soul.md", "tools.md"})


@dataclass(frozen=True, slots=True)
class PrivacyScope:
    """What one turn may show of the owner's data. Build it with the functions below.

    ``owner_memory``: USER.md and memory/MEMORY.md in the prompt, ``memory_search`` over every
    chat's history and the memory files, the file tools on ``memory/`` and the memory
    repository. ``media``: this chat's download folder (relative to the workspace); None: every
    chat's (the owner). ``person``: the speaker's own memory file (bot.memory.people), in the
    prompt and open to the file tools, read and write; None: no person's file (the owner's
    scope has USER.md; a group with ``memory.peopleInGroups`` off; an unattended turn).
    """

    audience: Audience
    session_key: str
    admin: bool  # the sender is an admin (in a group: an admin's own turn)
    owner_memory: bool
    media: PurePosixPath | None
    person: str | None = None

    @property
    def is_owner(self) -> bool:
        return self.audience == "owner"

    def shows_prompt_file(self, name: str) -> bool:
        """Whether the workspace prompt file ``name`` goes into this turn's system prompt."""
        return self.owner_memory or name not in PROMPT_MEMORY_FILES

    @property
    def _chat_file(self) -> str:
        """This chat's file in memory/chats/ (as bot.memory.dream.chat_memory_file names it)."""
        return (key_to_filename(self.session_key).removesuffix(SUFFIX) + ".md").casefold()

    @property
    def history_session(self) -> str | None:
        """The one session ``memory_search`` may search (its own archived history, no memory
        files); None: all of it."""
        return None if self.owner_memory else self.session_key

    def hidden(self, rel: PurePosixPath, *, write: bool = False) -> str | None:
        """Why the file tools may not touch the workspace path ``rel`` (relative, real) in this
        chat, or None when they may. ``write`` is stricter: shared memory and the prompt files
        every chat reads stay read-only. Names are compared casefolded, so ``user.md`` on a
        case-insensitive disk is USER.md too."""
        if self.is_owner:
            return None
        parts = [p.casefold() for p in rel.parts]
        if not parts:
            return None
        top = parts[0]
        memory = top in _MEMORY_FOLDERS or (
            len(parts) == 1 and _names_file(top, _MEMORY_ROOT_FILES)
        )
        # A person's file is theirs alone: open to their own turns, read and write, whatever
        # else is shared; the folder is not listed (its names are who else talks to memobot).
        if parts[:2] == ["memory", "people"]:
            own = self.person is not None and parts == self.person.casefold().split("/")
            return None if own else "another person's memory"
        # The archive holds every chat's history, other people's private chats too: shared
        # memory shares it through memory_search, which shows the owner's chats and this
        # one only (bot.tools.memory_search), never as the files.
        if parts[:1] == ["memory"] and len(parts) == 2 and parts[1].startswith("history"):
            return "every chat's history (memory_search finds what this chat may see)"
        # Shared memory is shown, never rewritten: what a guest or a group says about itself
        # does not belong in the owner's USER.md.
        if memory and (write or not self.owner_memory):
            return "the owner's private memory"
        # Shared or not, what Dream keeps about another chat is that chat's (bot.memory.dream).
        if parts[:2] == ["memory", "chats"] and len(parts) > 2 and parts[2] != self._chat_file:
            return "another chat's memory"
        if len(parts) == 1 and _names_file(top, _OWNER_ROOT_FILES):
            return "the owner's heartbeat tasks"
        if write and len(parts) == 1 and _names_file(top, _PROMPT_ROOT_FILES):
            return "it shapes every chat's system prompt, the owner's too"
        if top == MEDIA_DIR and self.media is not None:
            own = [p.casefold() for p in self.media.parts]
            if parts[: len(own)] == own:
                return None
            # media/ and media/<channel>/ may be listed on the way to this chat's folder.
            if not write and own[: len(parts)] == parts:
                return None
            return "files sent in another chat"
        return None


def _names_file(name: str, files: frozenset[str]) -> bool:
    """``name`` is one of ``files`` or a temporary sibling of one (``.USER.md.dream-tmp``)."""
    return name in files or any(name.startswith(f".{f}.") for f in files)


def owner_scope(session_key: str) -> PrivacyScope:
    return PrivacyScope("owner", session_key, True, True, None)


def guest_scope(msg: InboundMessage, share: bool, person: str | None = None) -> PrivacyScope:
    return PrivacyScope(
        "guest", msg.session_key, False, share, chat_media_dir(msg.channel, msg.chat_id), person
    )


def group_scope(
    msg: InboundMessage, admin: bool, share: bool, person: str | None = None
) -> PrivacyScope:
    return PrivacyScope(
        "group", msg.session_key, admin, share, chat_media_dir(msg.channel, msg.chat_id), person
    )


def scope_for_person(msg: InboundMessage, memory: MemoryConfig) -> PrivacyScope:
    """The scope of a turn answering a person: decided by the chat and the sender alone. A
    person who is not the owner has their own memory file in it (in a group only with
    ``memory.peopleInGroups``: it holds what they said in private too, and the group reads
    the answer)."""
    own = person_file(msg.channel, msg.sender.id)
    if msg.sender.is_group:
        person = own if memory.people_in_groups else None
        return group_scope(msg, msg.sender.is_admin, memory.share_in_groups, person)
    if msg.sender.is_admin:
        return owner_scope(msg.session_key)
    return guest_scope(msg, memory.share_with_non_admins, own)


def scope_for_unattended(msg: InboundMessage, memory: MemoryConfig) -> PrivacyScope:
    """The scope of a scheduled job's or the heartbeat's turn: a group's in a group chat, the
    owner's elsewhere, unless a non-admin shaped it (a job a non-admin made, heartbeat tasks
    an untrusted turn wrote: ``NARROWED_KEY``, see bot.provenance): then a group member's
    scope that shares none of the owner's memory, whatever the settings."""
    if msg.classification.narrowed:
        return group_scope(msg, False, False)
    if msg.sender.is_group:
        return group_scope(msg, msg.sender.is_admin, memory.share_in_groups)
    return owner_scope(msg.session_key)
