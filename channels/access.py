"""allowFrom and admins: who may talk to the bot, decided before anything reaches the bus."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from bot.bus import OutboundMessage
from bot.gate.question import SHOW_ALL, QuestionView
from bot.pairing import PairingStore, code_text
from channels.refused import Chat, RefusedSenders, shown_name

if TYPE_CHECKING:
    from bot.config_base import ChannelConfig

log = logging.getLogger(__name__)

DENIAL_LOG_INTERVAL = 3600.0  # one log line per denied sender per hour
# Denied senders remembered for that hour, at most: a crowd of new ids costs bounded memory
# (the oldest forgotten first, then logged and noted again should they write again).
MAX_REMEMBERED = 4096
DmPolicy = Literal["allowlist", "pairing"]


def default_dm_policy(allow_from: Iterable[str]) -> DmPolicy:
    """The dmPolicy of a section that does not set one: nobody listed yet means a newcomer
    would meet silence, so strangers get a pairing code; a list means the owner chose."""
    return "allowlist" if any(True for _ in allow_from) else "pairing"


def dm_policy_of(section: ChannelConfig) -> DmPolicy:
    """The dmPolicy ``section`` (``channels.<name>``) works with, set or defaulted."""
    return section.dm_policy or default_dm_policy(section.allow_from)


class AccessPolicy:
    """A channel's allowFrom list. Empty denies everyone; ``"*"`` allows everyone."""

    def __init__(
        self,
        channel: str,
        allow_from: Iterable[str],
        admins: Iterable[str] | None = None,
        pairing: PairingStore | None = None,
        dm_policy: DmPolicy | None = "allowlist",
        refused: RefusedSenders | None = None,
    ) -> None:
        """``pairing``: ids approved through pairing count as listed (whatever the policy);
        with ``dm_policy`` "pairing" a stranger's private message gets a code; None (the
        config left it unset): "pairing" while ``allow_from`` is empty, else "allowlist".
        ``refused``: where refused senders are recorded for the owner (the panel)."""
        self.channel = channel
        self.pairing = pairing
        self.refused = refused
        self.configured_dm_policy = dm_policy
        self.allow = frozenset(allow_from)
        self.dm_policy: DmPolicy = dm_policy or default_dm_policy(self.allow)
        self.admins = frozenset(self.allow if admins is None else admins)
        self.open = "*" in self.allow
        self._denied_logged: dict[str, float] = {}
        self._paired_noted: dict[str, float] = {}  # strangers given a code, noted this hour

    @classmethod
    def for_channel(cls, channel: str, section: ChannelConfig, state_dir: Path) -> AccessPolicy:
        """The policy ``section`` (``channels.<channel>``) asks for, pairing store included."""
        return cls(
            channel,
            section.allow_from,
            section.admin_ids,
            PairingStore(state_dir, channel),
            section.dm_policy,
            RefusedSenders(state_dir, channel),
        )

    def reloaded(self, section: ChannelConfig) -> AccessPolicy:
        """This policy with ``section``'s allowFrom and admins (a SIGHUP reload), keeping
        what only a restart changes: the pairing store and the configured dmPolicy (an unset
        one follows the new allowFrom). Refused senders already logged this hour stay quiet."""
        policy = AccessPolicy(
            self.channel,
            section.allow_from,
            section.admin_ids,
            self.pairing,
            self.configured_dm_policy,
            self.refused,
        )
        policy._denied_logged = self._denied_logged
        policy._paired_noted = self._paired_noted
        return policy

    def log_startup(self) -> None:
        if self.open:
            log.warning(
                'channel %s: allowFrom contains "*": ANYONE who finds the bot can use it '
                "(and its tools)",
                self.channel,
            )
        elif not self.allow and self.dm_policy == "pairing":
            log.warning(
                "channel %s: allowFrom is empty: a private message from anyone gets a pairing "
                "code, logged here and listed by `memobot pairing list`; approve it with "
                "`memobot pairing approve CODE`",
                self.channel,
            )
        elif not self.allow:
            log.warning(
                "channel %s: allowFrom is empty, so every sender is refused; denied senders' "
                'ids are logged so you can add them (or set channels.%s.dmPolicy to "pairing")',
                self.channel,
                self.channel,
            )

    def allowed(self, *ids: str | None) -> bool:
        """True when any of the sender's stable ids is listed (or the list has "*")."""
        if self.open or any(i is not None and str(i) in self.allow for i in ids):
            return True
        # One stat of the pairing file per refused message: approvals count at once.
        paired = self.pairing.approved_ids() if self.pairing is not None else frozenset()
        return any(i is not None and str(i) in paired for i in ids)

    async def pairing_reply(self, sender_id: str, name: str, chat_id: str) -> str | None:
        """What to answer a stranger's *private* message: a pairing code (once per hour per
        sender, at most 3 waiting per channel), or None (say nothing). Groups never pair:
        callers only ask for private chats."""
        if self.dm_policy != "pairing" or self.pairing is None:
            return None
        noted = _first_this_hour(self._paired_noted, sender_id, time.monotonic())
        try:
            code = await asyncio.to_thread(self.pairing.request, sender_id, name, chat_id)
            # No code now: one may wait from earlier, or the channel's codes are all taken
            # (strangers can fill them): then the owner must not be told one waits.
            waits = code is not None or (
                noted and await asyncio.to_thread(self._code_waits, sender_id)
            )
        except OSError as exc:
            log.error("channel %s: cannot store a pairing code: %s", self.channel, exc)
            code, waits = None, False
        if noted and self.refused is not None:
            self.refused.note(sender_id, name, "private", paired=waits)
        return code_text(code, self.channel, sender_id) if code else None

    def _code_waits(self, sender_id: str) -> bool:
        assert self.pairing is not None
        return any(r.sender_id == sender_id for r in self.pairing.listing().waiting)

    def is_admin(self, sender_id: str) -> bool:
        return "*" in self.admins or sender_id in self.admins

    def deny(
        self, sender_id: str, name: str = "", now: float | None = None, chat: Chat = "private"
    ) -> bool:
        """Record a refused sender (where they wrote: ``chat``); logs, and notes them for
        the owner's panel, at most once per sender per hour. True if logged."""
        if not _first_this_hour(
            self._denied_logged, sender_id, time.monotonic() if now is None else now
        ):
            return False
        name = shown_name(name)  # one line of the log, whatever the stranger wrote in it
        if self.refused is not None:
            self.refused.note(sender_id, name, chat)
        log.warning(
            "channel %s: message from %s%s refused: not in allowFrom. To let them in, add "
            '"%s" to channels.%s.allowFrom',
            self.channel,
            sender_id,
            f" ({name})" if name else "",
            sender_id,
            self.channel,
        )
        return True


def _first_this_hour(seen: dict[str, float], sender_id: str, now: float) -> bool:
    """True (and remembered) unless ``sender_id`` was seen within the hour."""
    last = seen.get(sender_id)
    if last is not None and now - last < DENIAL_LOG_INTERVAL:
        return False
    seen.pop(sender_id, None)
    seen[sender_id] = now  # at the end: the dict stays in the order of these times
    while len(seen) > MAX_REMEMBERED:
        del seen[next(iter(seen))]
    return True


# -- approval buttons: the same press data on every platform ---------------------------------

PRESS_PREFIX = "ap"


def approval_buttons(msg: OutboundMessage, cut: bool = False) -> list[tuple[str, str]]:
    """``(data, label)`` of each button an approval request carries (empty for any other
    message); ``cut``: its text was cut to fit, so "Show all" comes first.
    ``ap:<id>:<choice>`` fits Telegram's 64-byte callback data and Discord's and Slack's
    limits."""
    request = msg.metadata.get("approval")
    if not isinstance(request, dict):
        return []
    choices: dict[str, str] = {**({"show": SHOW_ALL} if cut else {}), **request.get("choices", {})}
    return [(f"{PRESS_PREFIX}:{request['id']}:{c}", label) for c, label in choices.items()]


def question_view(msg: OutboundMessage) -> QuestionView | None:
    """The parts of an approval question (``bot.approvals``), None for any other message or
    one without them (a question asked by an older memobot: its text is shown as it is)."""
    request = msg.metadata.get("approval")
    if not isinstance(request, dict) or not isinstance(request.get("subject"), str):
        return None
    return QuestionView(
        str(request.get("id", "")),
        str(request.get("intro", "")),
        request["subject"],
        str(request.get("outro", "")),
    )


def parse_press(data: str) -> dict[str, str] | None:
    """``{"id", "choice"}`` of an approval button's data; None for anything else."""
    prefix, _, rest = data.partition(":")
    approval_id, _, choice = rest.partition(":")
    if prefix != PRESS_PREFIX or not approval_id or not choice:
        return None
    return {"id": approval_id, "choice": choice}


def whoami_text(channel: str, sender_id: str, allowed: bool) -> str:
    state = "allowed" if allowed else f"not allowed (add it to channels.{channel}.allowFrom)"
    return f"Your {channel} user id is {sender_id}. You are {state}."
