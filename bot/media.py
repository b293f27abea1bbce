"""Files a message carries by reference, fetched by their channel just before the turn runs.

A platform may give a channel a deadline to confirm a message that is far shorter than a
download takes (Slack: 3 s to acknowledge; a file may take two minutes). Such a message is
accepted at once as a pending turn that names its files (``FileRef``: the platform's id, name,
size, type and address, never a credential), so it is durable before the platform hears "ok".
Before the turn runs, the agent loop asks the message's channel to fetch them
(``MessageBus.fetch_media``, which the channel manager routes to ``Channel.fetch_media``); a
crash before or during the download loses nothing, since the pending turn is resumed at the
next start and its files are fetched then. A file that cannot be fetched becomes a note in the
person's message (``with_fetched``), never a lost message or a stuck chat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bot.bus import InboundMessage


@dataclass(frozen=True, slots=True)
class FileRef:
    """One file a message names but memobot does not hold yet. ``extra``: what else the
    platform said of it that its channel needs to fetch it (Slack: the file's ``mode``)."""

    id: str
    name: str = ""
    size: int | None = None
    mimetype: str = ""
    url: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How the person knows the file: its name, else its id."""
        return self.name or self.id

    def record(self) -> dict[str, Any]:
        """The stored form (in a pending turn): empty fields left out."""
        out: dict[str, Any] = {"id": self.id}
        for name in ("name", "size", "mimetype", "url"):
            value = getattr(self, name)
            if value not in ("", None):
                out[name] = value
        if self.extra:
            out["extra"] = dict(self.extra)
        return out

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> FileRef:
        size = record.get("size")
        extra = record.get("extra")
        return cls(
            id=str(record.get("id") or ""),
            name=str(record.get("name") or ""),
            size=size if type(size) is int else None,
            mimetype=str(record.get("mimetype") or ""),
            url=str(record.get("url") or ""),
            extra=dict(extra) if isinstance(extra, Mapping) else {},
        )


@dataclass(frozen=True, slots=True)
class Fetched:
    """What became of one ``FileRef``: saved at ``path`` (in the workspace), or not, and why
    (``problem``, in words the person understands: "HTTP 404", "larger than 20 MB")."""

    ref: FileRef
    path: str | None = None
    problem: str = ""


def not_fetched(refs: Sequence[FileRef], problem: str) -> list[Fetched]:
    return [Fetched(ref, None, problem) for ref in refs]


def fetch_note(fetched: Fetched) -> str:
    """The note the model reads for a file that could not be fetched."""
    return f"[file {fetched.ref.label} could not be fetched: {fetched.problem or 'no reason'}]"


def with_fetched(msg: InboundMessage, results: Sequence[Fetched]) -> InboundMessage:
    """``msg`` with its files fetched: the saved ones in ``media``, a note in the text for
    each one that was not (and for any file the channel did not answer for); no ``files``."""
    by_id = {id(r.ref): r for r in results}
    paths: list[str] = []
    notes: list[str] = []
    for ref in msg.files:
        result = by_id.get(id(ref)) or next((r for r in results if r.ref == ref), None)
        if result is None:
            result = Fetched(ref, None, "the channel did not fetch it")
        if result.path:
            paths.append(result.path)
        else:
            notes.append(fetch_note(result))
    text = "\n".join([msg.text, *notes]).strip() if notes else msg.text
    return replace(msg, text=text, media=(*msg.media, *paths), files=())
