"""Dream's edits reviewed by an admin before they land (``memory.dreamReview``).

A run that would change the memory files stores its whole edit as a *proposal* instead of
writing it: every changed file's text before and after, the changes with the history entries
each came from, and the range of entries it considered. The proposal lives in the state folder
(``<state>/dream/review.json``, out of the model's reach; written by :mod:`bot.durable` under a
lock), never in the workspace, so the model can neither read nor steer what it says.

It is a question on the approval desk (:class:`DreamReview`; :mod:`bot.approvals`): an
``ap-…`` id, buttons Allow and Deny in the admins' private chats, ``/allow ID`` and ``/deny
ID`` where there are none, and the panel's Approvals screen. Only an admin may answer, and the
first answer wins: it is recorded durably before anything else happens, so a crash between the
answer and the landing finishes the landing (or the skip) at the next start, and a press
delivered twice is recorded once. Allow lands the edit only when every file it touches is still
as it was when proposed (a newer edit is never overwritten: the proposal is dropped and the
next run redoes the same entries). Deny writes nothing and moves the Dream cursor past the
entries the run considered. At most one proposal is open: Dream does not run again while one
waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot import durable
from bot.gate.approval import SHOW, WAITING, new_approval_id
from bot.gate.question import QuestionView, full_text, question_markdown
from bot.private import make_private_dirs, replace_durably
from bot.provenance import Writer
from bot.wording import counted

if TYPE_CHECKING:
    from bot.bus import InboundMessage, MessageBus
    from bot.memory.dream import Dream

log = logging.getLogger(__name__)

FOLDER = "dream"  # in agent.stateDir
STORE_VERSION = 1
CLOSED_KEPT = 32  # answered proposals remembered: a late or repeated press is told so
ALLOW, DENY = "once", "deny"  # the desk's choices ("Allow" is its "once")
# What the buttons offer: a proposal is allowed or denied, never "always".
CHOICES = {ALLOW: "Allow", DENY: "Deny"}
DREAM_KEY = "dream"  # what the panel names the proposal's "chat" by
SUMMARY_KINDS = (("added", "Added"), ("replaced", "Replaced"), ("removed", "Removed"))
SKILLS = ("skills", "Skills written")


@dataclass(frozen=True, slots=True)
class Change:
    """One file of a proposal: its text when the run read it (``existed``: it was a file) and
    the text Dream would write. ``prior``: who wrote ``before`` (a watched file), to put that
    record back if the commit fails and the file is restored."""

    rel: str
    before: str
    existed: bool
    after: str
    prior: Writer | None = None

    def to_dict(self) -> dict[str, Any]:
        prior = None if self.prior is None else [self.prior.by, self.prior.trusted]
        return {
            "rel": self.rel,
            "before": self.before,
            "existed": self.existed,
            "after": self.after,
            "prior": prior,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Change:
        prior = data.get("prior")
        return cls(
            str(data["rel"]),
            str(data["before"]),
            bool(data["existed"]),
            str(data["after"]),
            Writer(str(prior[0]), bool(prior[1])) if prior else None,
        )


@dataclass(frozen=True, slots=True)
class Proposal:
    """An edit Dream proposes, and the answer to it once there is one (``state``: waiting,
    then the desk's choice "once" or "deny", recorded before the edit lands or is skipped)."""

    id: str
    first: int  # the cursors of the first and last history entry the run considered
    last: int
    entries: int
    changes: tuple[Change, ...]
    # "added", "replaced", "removed", "skills": Dream's one-line changes, each naming the
    # history entries it comes from.
    summary: dict[str, list[str]] = field(default_factory=dict)
    asked_at: float = 0.0
    asked_in: tuple[tuple[str, str], ...] | None = None  # None: not asked yet
    state: str = WAITING
    by: str = ""
    press: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "first": self.first,
            "last": self.last,
            "entries": self.entries,
            "changes": [c.to_dict() for c in self.changes],
            "summary": self.summary,
            "asked_at": self.asked_at,
            "asked_in": None if self.asked_in is None else [list(c) for c in self.asked_in],
            "state": self.state,
            "by": self.by,
            "press": self.press,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Proposal:
        asked_in = data.get("asked_in")
        return cls(
            id=str(data["id"]),
            first=int(data["first"]),
            last=int(data["last"]),
            entries=int(data.get("entries", 0)),
            changes=tuple(Change.from_dict(c) for c in data.get("changes") or []),
            summary={str(k): [str(i) for i in v] for k, v in (data.get("summary") or {}).items()},
            asked_at=float(data.get("asked_at", 0)),
            asked_in=None if asked_in is None else tuple((str(c), str(i)) for c, i in asked_in),
            state=str(data.get("state", WAITING)),
            by=str(data.get("by", "")),
            press=str(data.get("press", "")),
        )

    @property
    def files(self) -> list[str]:
        return [c.rel for c in self.changes]

    def view(self) -> QuestionView:
        """The question as the chats and the panel show it: memobot's words around the diff
        (the model's words: shown made visible and quoted, as a tool call's arguments are)."""
        intro = (
            f"Dream wants to change the long-term memory, from history entries "
            f"#{self.first}..#{self.last} ({counted(self.entries, 'entry', 'entries')}). "
            "Nothing is written until an admin allows it:"
        )
        outro = (
            f"Write it? (Deny skips these entries.)\n(or reply /allow {self.id} or /deny {self.id})"
        )
        return QuestionView(self.id, intro, self.subject(), outro)

    def subject(self) -> str:
        """The changes, each with its history entries, then the unified diff of every file."""
        lines: list[str] = []
        for key, title in (*SUMMARY_KINDS, SKILLS):
            items = self.summary.get(key) or []
            if items:
                lines.append(f"{title}:")
                lines += [f"- {i}" for i in items]
        return "\n".join(lines) + "\n\n" + diff_text(self.changes)


def new_proposal(
    first: int,
    last: int,
    entries: int,
    changes: list[Change],
    summary: dict[str, list[str]],
    now: float | None = None,
) -> Proposal:
    return Proposal(
        new_approval_id(),  # an approval's id: /allow ID and the buttons' data take it
        first,
        last,
        entries,
        tuple(changes),
        summary,
        asked_at=time.time() if now is None else now,
    )


def diff_text(changes: tuple[Change, ...] | list[Change]) -> str:
    """Unified diff (git's ``a/`` ``b/`` names; a new file from /dev/null) of every change."""
    out: list[str] = []
    for c in changes:
        old = c.before.splitlines(keepends=True) if c.existed else []
        new = c.after.splitlines(keepends=True)
        name = f"a/{c.rel}" if c.existed else "/dev/null"
        for line in difflib.unified_diff(old, new, name, f"b/{c.rel}"):
            out.append(line if line.endswith("\n") else line + "\n")
    return "".join(out)


class ProposalStore:
    """``<state>/dream/review.json``: the open proposal (at most one) and the ids of the last
    answered ones. Every change is a read-modify-write under ``review.lock`` (the gateway and a
    ``memobot dream`` at once), replaced durably; readers need no lock."""

    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / FOLDER
        self.path = self.folder / "review.json"
        self.lock_path = self.folder / "review.lock"

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(durable.read_regular(self.path))
            if not isinstance(data, dict) or not isinstance(data.get("closed", []), list):
                raise ValueError("not a review record")
            if data.get("open") is not None:
                Proposal.from_dict(data["open"])
        except FileNotFoundError:
            return {"open": None, "closed": []}
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            # Never skipped silently: kept aside, said, and the run that made it goes over
            # the same entries again (its cursor never moved).
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            with contextlib.suppress(OSError):
                durable.move(self.path, aside)
            log.error("dream: %s cannot be read (%s); moved to %s", self.path, exc, aside.name)
            return {"open": None, "closed": []}
        return data

    def open(self) -> Proposal | None:
        """The proposal that waits for an answer, or was answered and has not landed yet."""
        raw = self._load().get("open")
        return Proposal.from_dict(raw) if isinstance(raw, dict) else None

    def closed(self, proposal_id: str) -> dict[str, Any] | None:
        """An answered proposal's record ({"id", "state", "outcome", "by", "press"}), or None."""
        for item in self._load().get("closed") or []:
            if isinstance(item, dict) and item.get("id") == proposal_id:
                return item
        return None

    def owns(self, proposal_id: str) -> bool:
        current = self.open()
        return (current is not None and current.id == proposal_id) or bool(self.closed(proposal_id))

    @contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        make_private_dirs(self.folder)
        with durable.exclusive(self.lock_path):
            data = self._load()
            before = json.dumps(data, sort_keys=True)
            yield data
            if json.dumps(data, sort_keys=True) != before:
                data["version"] = STORE_VERSION
                replace_durably(self.path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")

    def propose(self, proposal: Proposal) -> Proposal | None:
        """Store ``proposal`` as the open one; None (nothing stored) when one is open already."""
        with self._changing() as data:
            if data.get("open"):
                return None
            data["open"] = proposal.to_dict()
            return proposal

    def mark_asked(self, proposal_id: str, chats: list[tuple[str, str]]) -> None:
        with self._changing() as data:
            current = data.get("open")
            if isinstance(current, dict) and current.get("id") == proposal_id:
                current["asked_in"] = [list(c) for c in chats]

    def decide(self, proposal_id: str, choice: str, by: str, press: str) -> Proposal | None:
        """Record the answer, first writer wins: the decided proposal, or None when it is not
        the open one or was answered already."""
        with self._changing() as data:
            current = data.get("open")
            if not isinstance(current, dict) or current.get("id") != proposal_id:
                return None
            if current.get("state") != WAITING:
                return None
            current.update(state=choice, by=by, press=press)
            return Proposal.from_dict(current)

    def close(self, proposal: Proposal, outcome: str, detail: str = "") -> None:
        """The ``proposal`` done with (``outcome``: applied, denied, stale, failed; dropped:
        unanswered, memory.dreamReview turned off):
        no longer open; its id, answer and press kept among the last answered."""
        with self._changing() as data:
            current = data.get("open")
            if isinstance(current, dict) and current.get("id") == proposal.id:
                data["open"] = None
            closed = [c for c in data.get("closed") or [] if c.get("id") != proposal.id]
            closed.append(
                {
                    "id": proposal.id,
                    "state": proposal.state,
                    "outcome": outcome,
                    "detail": detail,
                    "by": proposal.by,
                    "press": proposal.press,
                    "at": time.time(),
                }
            )
            data["closed"] = closed[-CLOSED_KEPT:]


def waiting_line(state_dir: Path) -> str | None:
    """``memobot status``'s words for a proposal that waits, or None."""
    try:
        proposal = ProposalStore(state_dir).open()
    except (OSError, ValueError, KeyError, TypeError):
        return "its review record cannot be read"
    if proposal is None:
        return None
    if proposal.state != WAITING:
        return f"proposal {proposal.id} answered, lands at the gateway's next start or run"
    files = ", ".join(proposal.files)
    return (
        f"proposal {proposal.id} waits for an admin's answer "
        f"(history #{proposal.first}..#{proposal.last}: {files})"
    )


class DreamReview:
    """Dream's proposals as questions of the approval desk: asked in the admins' private
    chats, answered by a button, ``/allow`` ``/deny`` or the panel (``ApprovalDesk`` hands
    every press of a proposal's id here)."""

    def __init__(self, dream: Dream, bus: MessageBus) -> None:
        self.dream = dream
        self.store = dream.proposals
        self.bus = bus

    async def ask(self, proposal: Proposal) -> None:
        """Show the question in the admins' private chats (where an unattended turn's question
        goes); recorded as asked, so a restart does not ask again."""
        try:
            chats = await self.bus.owner_chats("", "")
        except Exception:
            log.exception("dream: cannot find the admins' chats for proposal %s", proposal.id)
            chats = []
        if not chats:
            log.warning(
                "dream: proposal %s: no admin's private chat to ask in; answer it in the "
                "panel's Approvals screen or with /allow %s or /deny %s",
                proposal.id,
                proposal.id,
                proposal.id,
            )
        await asyncio.to_thread(self.store.mark_asked, proposal.id, chats)
        view = proposal.view()
        text, _ = question_markdown(view)
        request = {
            "id": proposal.id,
            "choices": dict(CHOICES),
            "intro": view.intro,
            "subject": view.subject,
            "outro": view.outro,
        }
        from bot.bus import OutboundMessage
        from bot.kinds import APPROVAL_KEY

        for channel, chat_id in chats:
            await self.bus.publish_outbound(
                OutboundMessage(channel, chat_id, text, metadata={APPROVAL_KEY: request})
            )

    def owns(self, approval_id: str) -> bool:
        """Whether ``approval_id`` is a proposal's (open or answered): a blocking read."""
        return self.store.owns(approval_id)

    def asked_in(self, approval_id: str) -> list[tuple[str, str]]:
        """The chats the open proposal ``approval_id`` was asked in (a blocking read)."""
        current = self.store.open()
        if current is None or current.id != approval_id:
            return []
        return list(current.asked_in or ())

    async def press(self, msg: InboundMessage) -> str | None:
        press = msg.classification.press
        assert press is not None
        return await self.answer(
            press.id, press.choice, msg.sender_id, msg.sender.is_admin, msg.message_id or ""
        )

    async def answer(
        self, approval_id: str, choice: str, by: str, is_admin: bool, press: str
    ) -> str | None:
        """Record one answer and act on it; the reply for whoever answered, None when it is
        the same press delivered again."""
        from bot.approvals import ANSWERED

        current = await asyncio.to_thread(self.store.open)
        if current is None or current.id != approval_id or current.state != WAITING:
            return await self._late(approval_id, press, current)
        if not is_admin:
            log.info("dream: proposal %s press refused: sender=%s is no admin", approval_id, by)
            return "Only an admin of this bot may answer this approval."
        if choice == SHOW:
            return full_text(current.id, current.subject())
        if choice not in CHOICES:
            return (
                "A change Dream proposes is allowed or denied: "
                f"/allow {approval_id} or /deny {approval_id}."
            )
        decided = await asyncio.to_thread(self.store.decide, approval_id, choice, by, press)
        if decided is None:  # another answer was recorded first: maybe still being carried out
            latest = await asyncio.to_thread(self.store.open)
            return await self._late(approval_id, press, latest) or ANSWERED
        log.info("dream: proposal %s answered %s by %s", approval_id, choice, by)
        return await self.dream.settle(decided)

    async def _late(self, approval_id: str, press: str, current: Proposal | None) -> str | None:
        from bot.approvals import ANSWERED, EXPIRED

        if current is not None and current.id == approval_id:
            earlier: dict[str, Any] | None = {"press": current.press}
        else:
            earlier = await asyncio.to_thread(self.store.closed, approval_id)
        if earlier is None or earlier.get("outcome") == "dropped":
            return EXPIRED  # dropped: nobody answered it (memory.dreamReview turned off)
        if press and earlier.get("press") == press:
            return None  # the same press delivered again after a restart
        return ANSWERED

    async def resume(self) -> None:
        """At the gateway's start: land (or skip) a proposal answered before a crash, and ask
        about one stored but never asked (a ``memobot dream`` run, or a crash before asking)."""
        try:
            current = await asyncio.to_thread(self.store.open)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("dream: the review record cannot be read: %s", exc)
            return
        if current is None:
            return
        if current.state != WAITING:
            log.info("dream: proposal %s was answered before a restart: finishing it", current.id)
            await self.dream.settle(current)
        elif not self.dream.cfg.dream_review:
            # Turned off while it waited: Dream's next run drops it (nothing written).
            log.info("dream: proposal %s waits, but memory.dreamReview is off", current.id)
        elif current.asked_in is None:
            await self.ask(current)
        else:
            log.info(
                "dream: proposal %s waits for an admin's answer (its buttons still work)",
                current.id,
            )


def as_proposed(current: str, is_file: bool, change: Change) -> bool:
    """Whether a file is as the proposal left it: as it was read, or (a landing cut short by
    a crash) as it would be written."""
    return (is_file == change.existed and current == change.before) or (
        is_file and current == change.after
    )


__all__ = [
    "Change",
    "DreamReview",
    "Proposal",
    "ProposalStore",
    "as_proposed",
    "diff_text",
    "new_proposal",
    "waiting_line",
]
