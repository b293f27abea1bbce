"""What every channel is: a name, a lifecycle, and a way to send one chunk of text."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from bot.bus import InboundMessage, MessageBus, OutboundMessage, StreamEvent
from bot.commands import CommandSyntax
from bot.gate.question import QuestionView, question_markdown
from bot.media import Fetched, not_fetched
from bot.service.logs import redact
from channels.access import AccessPolicy, question_view
from channels.errors import FatalChannelError, FeatureUnavailable, PermanentError, SendError
from channels.pacing import Limit

if TYPE_CHECKING:
    from bot.config_base import ChannelConfig

log = logging.getLogger(__name__)

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


# Of a sender's file name, at most this many characters are kept: with an id before it and a
# temporary file's prefix and suffix around it, a name stays far under the 255 bytes a folder
# entry may have (a longer one failed the download after the whole file had come).
SAFE_NAME_CHARS = 120


def safe_file_name(name: str) -> str:
    """A sender's file name as a name in a chat's media folder: its last part, characters
    outside ``A-Za-z0-9._-`` as ``_``, no leading or trailing dot ("file" if nothing is left),
    at most ``SAFE_NAME_CHARS`` long (cut before its extension)."""
    safe = _UNSAFE_NAME.sub("_", Path(name).name).strip("._") or "file"
    if len(safe) > SAFE_NAME_CHARS:
        suffix = Path(safe).suffix[:16]
        safe = (safe[: SAFE_NAME_CHARS - len(suffix)].rstrip("._") or "file") + suffix
    return safe


State = Literal["stopped", "starting", "connected", "reconnecting", "failed"]
# How a chat shows an answer while it is written: "draft" (a platform draft, stored nowhere),
# "message" (a message sent, then edited; recorded in the delivery ledger), "direct" (shown
# at once by the channel itself: the terminal), "off" (only the final answer).
PreviewMode = Literal["off", "draft", "message", "direct"]


class Channel(ABC):
    """One chat platform (or the terminal).

    Receiving: the channel publishes ``InboundMessage`` values with ``bus.publish_inbound`` and
    confirms them to its platform only once that returns "accepted" or "duplicate".
    Sending: the channel manager calls ``render`` once per answer and ``send_chunk`` per piece
    (``first`` for the answer's first piece, the one that quotes the message it answers where
    the platform shows replies), and owns retries; ``send_chunk`` raises the classes in
    ``channels.errors`` (anything else is retried like a ``TransientError``). A piece refused
    with ``TooLong`` goes through ``resplit``. The pieces of an answer are recorded in the
    delivery ledger before the first is sent, so a restart resumes at the piece that did not
    go out. Every send (retries included) first waits out the buckets ``pace_limits`` names
    for its chat.
    Failing for good (token refused): ``fail`` with a ``FatalChannelError`` (or raise it from
    ``start`` or ``send_chunk``); the state becomes "failed" and stays so.
    Platform calls go through ``calling``: the channel's ``classify`` maps its SDK's
    exceptions, and what an error means for the whole channel is applied there for every
    platform alike (a refused token fails it; an optional method the platform does not offer
    switches its feature off, ``switch_off``, logged once and shown in ``status``).
    Streaming (``streaming`` True): the channel manager shows each answer while it is written
    the way ``preview_mode`` says, through the same pacing; the final answer then replaces the
    preview (``edit_chunk`` of the preview messages) instead of adding a second copy, and
    leaves a preview that already shows its piece (``preview_shows``) as it is.
    """

    name: str
    streaming: bool = False
    sends_files: bool = False  # send_file works (else a long answer's file is named in a note)
    max_file_bytes: int | None = None  # the largest upload the platform takes (None: no limit)
    stream_interval: float = 1.0  # seconds between two preview updates of one chat
    typing_delay: float = 0.0  # seconds a turn runs before "typing..." is shown
    command_syntax = CommandSyntax()  # how commands are written here, for /help
    # Methods behind optional features: method -> (feature, what serves instead when off).
    optional_methods: ClassVar[Mapping[str, tuple[str, str]]] = {}
    # Who may talk here (allowFrom, admins, pairing); None: a channel without an allowFrom
    # (the terminal), whose access no reload changes.
    policy: AccessPolicy | None = None
    # False for a face of memobot itself (the panel's chat): it has no platform that could
    # refuse it, and it does not keep a gateway running whose every platform failed for good.
    platform: ClassVar[bool] = True

    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self.state: State = "stopped"
        self.state_detail = ""
        self.last_event_at: float | None = None  # wall clock of the last inbound event
        self.fatal: FatalChannelError | None = None
        # Set by the channel manager: told once when this channel fails for good.
        self.on_fatal: Callable[[Channel], None] | None = None
        # Set by the gateway: told of every change of state, so `memobot status` is current.
        self.on_state: Callable[[], None] | None = None
        self.features_off: dict[str, str] = {}  # feature -> why (for as long as this runs)

    def set_state(self, state: State, detail: str = "") -> bool:
        """Whether this is a change. ``detail`` is kept redacted: it often quotes an SDK's
        error, whose URL may carry the token (Telegram's /bot<token>/), and it goes into the
        gateway's status file and `memobot status`, which no log filter sees."""
        detail = redact(detail)
        changed = state != self.state or detail != self.state_detail
        self.state = state
        self.state_detail = detail
        if changed and self.on_state is not None:
            self.on_state()
        return changed

    def fail(self, error: FatalChannelError) -> None:
        """This channel cannot work until its configuration is fixed: "failed", for good.

        ``str(error)`` says what to fix. Idempotent: the first error is the one kept.
        """
        if self.fatal is not None:
            return
        self.fatal = error
        log.error("%s: failed: %s", self.name, error)
        self.set_state("failed", str(error))
        if self.on_fatal is not None:
            self.on_fatal(self)

    def reload_access(self, section: ChannelConfig) -> bool:
        """A reload changed ``section``'s allowFrom or admins: rebuild the access policy from
        it, keeping what the channel built it with (pairing store, dmPolicy). False when this
        channel keeps no policy (the change then waits for a restart)."""
        if self.policy is None:
            return False
        self.policy = self.policy.reloaded(section)
        self.policy.log_startup()  # warns again if the list is now empty or "*"
        return True

    def touch(self) -> None:
        self.last_event_at = time.time()

    def switch_off(self, error: FeatureUnavailable) -> None:
        """The platform does not offer ``error.feature``: off for this channel from now on
        (until a restart), logged once; ``feature_on`` says so to whoever would use it."""
        if error.feature in self.features_off:
            return
        self.features_off[error.feature] = str(error)
        instead = next(
            (i for f, i in self.optional_methods.values() if f == error.feature and i), ""
        )
        log.warning(
            "%s: %s off: %s%s", self.name, error.feature, error, f"; {instead}" if instead else ""
        )

    def feature_on(self, feature: str) -> bool:
        return feature not in self.features_off

    def status(self) -> dict[str, Any]:
        """What ``memobot status`` shows of this channel (the gateway's status file)."""
        return {
            "state": self.state,
            "detail": self.state_detail,
            "last_event_at": self.last_event_at,
            "features_off": dict(self.features_off),
        }

    def classify(self, exc: Exception, method: str) -> SendError | FatalChannelError | None:
        """``exc``, raised by the SDK in platform call ``method``, in our error vocabulary;
        None for an exception that is not the platform's answer (a bug, an answer the SDK
        could not read: the manager retries those a few times, then gives up)."""
        return None

    @contextlib.contextmanager
    def calling(self, method: str) -> Iterator[None]:
        """Around one platform call: its failure comes out as ``classify`` says, and what it
        means for the channel is applied here: a refused token fails the channel, an
        optional method the platform lacks switches its feature off."""
        try:
            yield
        except (SendError, FatalChannelError):
            raise
        except Exception as exc:
            error = self.classify(exc, method)
            if error is None:
                raise
            if isinstance(error, FatalChannelError):
                self.fail(error)
            elif isinstance(error, FeatureUnavailable):
                self.switch_off(error)
            raise error from exc

    async def start(self) -> None:  # noqa: B027 - most channels need no start-up work
        """Connect and begin publishing inbound messages; return once running."""

    async def stop(self) -> None:  # noqa: B027
        """Disconnect cleanly."""

    def render(self, text: str) -> list[str]:
        """Split and format an answer into the pieces ``send_chunk`` takes (default: as is)."""
        return [text]

    def render_message(self, msg: OutboundMessage) -> list[str]:
        """The pieces of ``msg``: ``render(msg.text)``, but an approval question is always
        one piece, the one that carries its buttons (``render_question``)."""
        view = question_view(msg)
        if view is None:
            return self.render(msg.text)
        return [self.render_question(view)[0]]

    def render_question(self, view: QuestionView) -> tuple[str, bool]:
        """An approval question as one message, and whether its text had to be cut to fit
        (the message then carries a "Show all" button). Default, for a channel without a
        length limit: the whole question, rendered."""
        text, _ = question_markdown(view)
        return "\n".join(self.render(text)), False

    def plain(self, chunk: str) -> str:
        """The chunk without markup, for the retry after the platform rejected the markup."""
        return chunk

    def resplit(self, chunk: str) -> list[str]:
        """``chunk`` (a piece of ``render``) in smaller pieces, after the platform refused it
        as too long. Fewer than two pieces: it cannot be split (the answer is undeliverable)."""
        return []

    def pace_limits(self, chat_id: str) -> Sequence[Limit]:
        """The rate-limit buckets every send to ``chat_id`` draws from, the chat's own first,
        the bot's shared ones last (the channel manager waits them out in that order)."""
        return ()

    @abstractmethod
    async def send_chunk(
        self, msg: OutboundMessage, chunk: str, plain: bool = False, *, first: bool = False
    ) -> None:
        """Deliver one piece of ``msg`` to its chat. Raise ``channels.errors`` classes.

        ``first``: the answer's first piece; only it replies to ``msg.reply_to``."""

    def not_offered(self, call: str) -> PermanentError:
        """The error of a call this channel does not offer (the manager calls only what
        ``sends_files`` and ``preview_mode`` declare): a channel that declares more than it
        implements refuses that one piece, with its name, instead of crashing a delivery."""
        log.error("%s: %s is not offered by this channel (a declaration is wrong)", self.name, call)
        return PermanentError(f"{self.name} does not offer {call}")

    async def send_file(self, msg: OutboundMessage, path: str) -> None:
        """Upload the file at ``path`` (memobot's own, e.g. a long answer's whole text) to
        ``msg``'s chat, as ``send_chunk`` raises. Only called when ``sends_files``."""
        raise self.not_offered("send_file")

    @staticmethod
    async def file_to_send(path: str) -> bytes:
        """The bytes of ``path`` for ``send_file``, read off the event loop; a file that
        cannot be read is a ``PermanentError`` (sending it again cannot help)."""
        try:
            return await asyncio.to_thread(Path(path).read_bytes)
        except OSError as exc:
            raise PermanentError(f"the file {Path(path).name} cannot be read: {exc}") from exc

    async def fetch_media(self, msg: InboundMessage) -> Sequence[Fetched]:
        """Fetch the files ``msg`` names (``msg.files``, as this channel published them) into
        the workspace, just before its turn runs; one ``Fetched`` per file, in order. Never
        raises for a file the platform will not give: that file's ``problem`` says why (the
        person reads it). Called again for the same message after a crash: a file already
        saved may be found where it was saved instead of fetched again. Only a channel that
        publishes ``files`` needs it; the others download before they publish."""
        return not_fetched(msg.files, f"the {self.name} channel does not fetch files")

    async def admin_chats(self) -> list[str]:
        """The chat ids of the admins' private chats, for notices to the owner; [] if the
        platform gives no way to find them."""
        return []

    def count_usage(self, session: str, purpose: str, prompt: int, completion: int) -> None:  # noqa: B027
        """A model call was counted (bot.spend; the gateway tells every channel). Only a
        channel that reports usage with its answers (the API) keeps anything."""

    async def send_typing(self, chat_id: str) -> None:  # noqa: B027
        """Show "typing..." in the chat (platforms without it: nothing)."""

    # -- streaming (only called when ``streaming``) --
    # Each channel implements the calls of the preview mode it returns (Telegram: draft and
    # message; Discord and Slack: message; the terminal: direct); the manager never calls the
    # others, so they raise here rather than pretend to show anything.

    def preview_mode(self, chat_id: str) -> PreviewMode:
        return "off"

    def preview_pieces(self, text: str) -> list[str]:
        """Streamed text (raw Markdown, shown plain) in pieces within the length limit."""
        return [text]

    def show_stream(self, event: StreamEvent) -> None:
        """ "direct" mode: show ``event`` now (no pacing, no platform)."""
        raise self.not_offered("show_stream")

    async def send_draft(self, chat_id: str, draft_id: int, text: str) -> None:
        """ "draft" mode: show ``text`` ("" while tools run) as the chat's draft ``draft_id``."""
        raise self.not_offered("send_draft")

    async def send_preview(self, msg: OutboundMessage, text: str, *, first: bool = False) -> str:
        """ "message" mode: send ``text`` plain to ``msg``'s chat; the platform's message id.
        ``first``: the answer's first message (as in ``send_chunk``)."""
        raise self.not_offered("send_preview")

    def preview_shows(self, message_id: str, preview: str, chunk: str) -> bool:
        """Whether preview message ``message_id``, last given the preview text ``preview``
        (plain, by ``send_preview`` or ``edit_chunk``), already shows what ``edit_chunk``
        would make of ``chunk`` (a piece of ``render``): the final answer then leaves it be
        rather than spend a send on an edit that changes nothing. Default: never (edited)."""
        return False

    async def edit_chunk(
        self, chat_id: str, message_id: str, chunk: str, plain: bool = False
    ) -> None:
        """Replace the text of message ``message_id`` with ``chunk`` (a piece of ``render``,
        or plain preview text with ``plain``). "Not modified" is success. Raises as
        ``send_chunk``; ``PermanentError`` when the message is gone."""
        raise self.not_offered("edit_chunk")

    async def delete_message(self, chat_id: str, message_id: str) -> None:
        """Delete a preview message the final answer did not need."""
        raise self.not_offered("delete_message")
